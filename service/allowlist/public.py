"""The public-text bundle: license texts and notices from the ScanCode LicenseDB.

Models quote licenses and notices all the time, and tenants paste them into prompts. Until three
tenants have sent one (``BLEEDWATCH_COMMON_PROMPT_TENANTS``) nothing tells bleedwatch it is
public, so a quote of a text one or two others sent is a high or critical false finding on day
one, when the operator's allowlist is still empty. The LicenseDB (``licensedcode-data`` on PyPI,
maintained by the ScanCode project, CC-BY-4.0) is the largest curated set of such texts: every
license's full text (``licenses/*.LICENSE``) and the notices, references and fragments ScanCode
detects them by (``rules/*.RULE``). Each file is YAML front matter between ``---`` lines, then
the text.

Left out: rules marked ``is_false_positive: yes`` (text ScanCode must *not* take for a license,
such as code that mentions one), anything under ``inactive/``, and texts under
``MIN_TOKENS`` tokens, too short to make a finding (a finding needs a run of about ten tokens)
and common enough words to allowlist real leaks with.

Only the front matter's top-level ``key: value`` lines are read, so the bundle needs no YAML
parser at run time.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bleedwatch.fingerprint.tokens import tokenize

DISTRIBUTION = "licensedcode-data"
REQUIREMENT = "licensedcode-data>=32"
INSTALL_HINT = f"pip install '{REQUIREMENT}'  (or: pip install 'bleedwatch-server[public]')"
SOURCE = "scancode-licensedb"
MIN_TOKENS = 12  # a finding needs 12 copied tokens (BLEEDWATCH_MIN_COPY_SCORE 9, plus n - 1)
SUFFIXES = (".LICENSE", ".RULE")


class BundleMissing(RuntimeError):
    """``licensedcode-data`` is not installed; the message is the pip line that fixes it."""


@dataclass(frozen=True, slots=True)
class PublicText:
    name: str  # path under licensedcode/data, e.g. "licenses/mit.LICENSE"
    text: str


@dataclass(frozen=True, slots=True)
class Bundle:
    version: str
    root: Path  # the licensedcode/data directory

    @property
    def label(self) -> str:
        """The allowlist entry's label: one entry per bundle version and key id."""
        return f"public:{SOURCE}:{self.version}"

    def texts(self, min_tokens: int = MIN_TOKENS) -> Iterator[PublicText]:
        """Every text worth allowlisting, in path order (so runs fingerprint the same texts)."""
        yield from read_texts(self.root, min_tokens)


def bundle() -> Bundle:
    """The installed LicenseDB, found by its distribution (ScanCode-toolkit has its own ``licensedcode``)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise BundleMissing(f"the public-text bundle is not installed: {INSTALL_HINT}") from None
    root = Path(str(dist.locate_file("licensedcode/data")))
    if not (root / "licenses").is_dir():
        raise BundleMissing(f"{DISTRIBUTION} {dist.version} has no licensedcode/data/licenses: {INSTALL_HINT}")
    return Bundle(dist.version, root)


def read_texts(root: Path, min_tokens: int = MIN_TOKENS) -> Iterator[PublicText]:
    """The selected texts of a LicenseDB tree laid out like ``licensedcode/data``."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in SUFFIXES or "inactive" in rel.parts or not path.is_file():
            continue
        meta, text = split_front_matter(path.read_text(encoding="utf-8", errors="replace"))
        if meta.get("is_false_positive", "").lower() in ("yes", "true"):
            continue
        if len(tokenize(text)) < min_tokens:
            continue
        yield PublicText(rel.as_posix(), text)


def split_front_matter(content: str) -> tuple[dict[str, str], str]:
    """(top-level scalar keys of the front matter, the text after it); no front matter: ({}, all)."""
    lines = content.split("\n")
    if not lines or lines[0].strip() != "---":
        return {}, content
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        return {}, content
    meta = {}
    for line in lines[1:end]:
        if line[:1].isalpha() and ":" in line:
            key, _, value = line.partition(":")
            meta[key.strip()] = value.strip().strip("'\"")
    return meta, "\n".join(lines[end + 1 :])
