"""Text for the evaluation, all of it shipped with Python or Debian, none written by us.

- private passages: stdlib docstrings, the Python reference topics (pydoc_data) and Debian
  package changelogs, cut into passages and de-duplicated: a passage that shares 8 tokens with
  an earlier one, in a row or around one small edit, is dropped, since text two tenants both
  own is not private and would make the ground truth ambiguous (``private_passages``);
- public texts: the licenses in /usr/share/common-licenses and the Zen of Python, which many
  tenants quote in prompts and answers, and which the operator allowlists up front (the
  allowlist is how bleedwatch knows public text before three tenants have sent it);
- templates: a few docstrings that groups of tenants use as their system prompt.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import random
from pathlib import Path

from bench.corpus import docstrings
from service.fingerprint.tokens import tokenize

PASSAGE_WORDS = (60, 400)
# Two passages are near-copies when they share two runs of ``SIDE_TOKENS`` tokens, in the same
# order, with at most ``EDIT_TOKENS`` tokens between them on either side (see private_passages).
SIDE_TOKENS = 4
EDIT_TOKENS = 2
# With near-copies kept, passages sharing this many tokens in a row are still copies, and dropped.
COPY_TOKENS = 16


def _pydoc_topics() -> list[list[str]]:
    from pydoc_data.topics import topics

    return [t.split() for t in topics.values()]


def _changelogs(limit_words: int) -> list[list[str]]:
    return [entry for _, entries in _changelogs_by_package(limit_words) for entry in entries]


def _changelogs_by_package(limit_words: int) -> list[tuple[str, list[list[str]]]]:
    """Entries of the Debian changelogs with their source package, until ``limit_words`` words.

    Binary packages built from one source ship the same changelog (libc6, libc-bin, ... of glibc).
    """
    out, total = [], 0
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
        try:
            with gzip.open(path) as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        entries = []
        source = text.split(None, 1)[0] if text.strip() else Path(path).parent.name
        for entry in text.split("\n\n"):
            words = [w for w in entry.split() if not w.startswith("<") and "@" not in w]
            if len(words) >= 30:
                entries.append(words)
                total += len(words)
        out.append((source, entries))
        if total >= limit_words:
            break
    return out


def _passages(docs: list[list[str]], rng: random.Random) -> list[list[str]]:
    out = []
    for words in docs:
        i = 0
        while i < len(words):
            size = rng.randint(*PASSAGE_WORDS)
            piece = words[i : i + size]
            if len(piece) >= PASSAGE_WORDS[0]:
                out.append(piece)
            i += size
    return out


def near_copy_keys(tokens: list[str]) -> set[tuple[str, ...]]:
    """What two near-copies have in common: a pair of ``SIDE_TOKENS``-token runs with at most
    ``EDIT_TOKENS`` tokens between them.

    The gap is not part of the key, so two texts share one exactly when they share 8 tokens in a
    row, or 8 tokens around one edit: up to 2 tokens substituted, inserted or removed ("fix race
    when deleting *free space* / *quota* root from the dirty cow roots list").
    """
    side, keys = SIDE_TOKENS, set()
    for i in range(len(tokens) - 2 * side + 1):
        left = tuple(tokens[i : i + side])
        for gap in range(min(EDIT_TOKENS, len(tokens) - i - 2 * side) + 1):
            keys.add(left + tuple(tokens[i + side + gap : i + 2 * side + gap]))
    return keys


def copy_keys(tokens: list[str]) -> set[tuple[str, ...]]:
    """What two copies have in common: ``COPY_TOKENS`` tokens in a row."""
    return {tuple(tokens[i : i + COPY_TOKENS]) for i in range(len(tokens) - COPY_TOKENS + 1)}


def private_passages(seed: int, changelog_words: int = 3_000_000, *, near_copies: bool = False) -> list[list[str]]:
    """De-duplicated passages, shuffled: a passage that is a near-copy of an earlier kept one is dropped.

    Near-copy: the two share 8 tokens in a row, or 8 tokens around one edit of up to 2 tokens
    (``near_copy_keys``). Text two tenants both own is not private, so it can be neither a leak
    source nor a clean exchange: the ground truth would score the service for finding it. An
    exact run is not enough to tell: changelogs of one upstream (the kernel's, shipped by several
    packages) carry the same line with one word changed, and no rule based on copied text can
    tell that from a leak with a word substituted, the very perturbation the detector must
    survive. The criterion follows what a finding needs at the least (two fingerprinted 4-token
    shingles on one diagonal, 10 tokens apart): each side of the edit holds a shingle. Unrelated
    passages rarely share two 4-token runs this close together: it keeps 3,259 passages instead
    of 3,344 (seed 7), and what it drops are changelog lines that differ by a version or a device
    name ("bump standards version to 4.x.y, no changes needed") and sibling docstrings ("prefix /
    suffix can also be a tuple of prefixes / suffixes to look for").

    With ``near_copies`` only copies are dropped (``COPY_TOKENS`` tokens in a row in common: one
    changelog shipped by several binary packages, a text and its derivative), and the passages keep
    the short phrases and near-copies unrelated real documents share (``run.py --near-copies``): the
    clean traffic then holds the coincidental overlap a looser threshold has to survive.

    Deterministic: the seed fixes the passages and their order, and the keys are the tokens
    themselves (no salted ``hash``).
    """
    rng = random.Random(seed)
    candidates = _passages(docstrings() + _pydoc_topics() + _changelogs(changelog_words), rng)
    rng.shuffle(candidates)
    seen: set[tuple[str, ...]] = set()
    kept: list[list[str]] = []
    for words in candidates:
        tokens = tokenize(" ".join(words))
        keys = copy_keys(tokens) if near_copies else near_copy_keys(tokens)
        if not keys.isdisjoint(seen):
            continue
        seen |= keys
        kept.append(words)
    return kept


def public_texts() -> list[list[str]]:
    texts = []
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file():
            texts.append(path.read_text(errors="replace").split())
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # prints the Zen of Python on first import
    texts.append("".join(this.d.get(c, c) for c in this.s).split())
    return [t for t in texts if len(t) >= 40]


def templates(count: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    docs = [d for d in docstrings(min_words=60) if len(d) <= 200]
    return [" ".join(d) for d in rng.sample(docs, count)]
