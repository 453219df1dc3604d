"""Corpus families: real text of several genres, so detection rules can be tuned on some and
reported on others.

Rules tuned on the text they are scored on do well there and worse elsewhere: the stdlib
docstrings, reference topics and changelogs the first evaluation used (``corpus.py``) are what
the thresholds were tuned on. Here the text comes in *families*, one genre each, none written by
us, all read from this machine (Debian 12, Python 3.11). ``SPLITS`` names which families to tune
on and which to hold out; report held-out numbers only, then swap.

A family lists its *sources* (a file, or a topic), each with a *group* (the package or module it
belongs to), and reads *documents* from them: a document is the list of whitespace-separated
words of one real file or entry. ``documents`` reads a family's sources in a fixed pseudo-random
order (a digest of the name, never the salted ``hash``), drops exact duplicates (binary packages
of one source ship the same files), and takes at most ``GROUP_WORDS`` words of one group and
``FAMILY_WORDS`` of the family: so no package fills a family (nodejs's changelogs, the 16,000
generated ``gcloud`` man pages) and a cap samples the whole machine, not the start of the alphabet.
Families that read Debian files depend on the packages installed, the Python ones on the Python
build (and for docstrings and code on Debian's python3 packages); none on what the process imported.

``private_passages`` cuts the chosen families into passages and de-duplicates them as
``corpus.py`` always has, dropping also those that quote public text; ``public_texts`` and
``held_out_public_texts`` are public text tenants quote (licenses), in two sets with no text in
common, one for each side of a split.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import glob
import gzip
import hashlib
import io
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tokenize as pytokenize
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.tokens import tokenize

PASSAGE_WORDS = (60, 400)
# Two passages are near-copies when they share two runs of ``SIDE_TOKENS`` tokens, in the same
# order, with at most ``EDIT_TOKENS`` tokens between them on either side (see private_passages).
SIDE_TOKENS = 4
EDIT_TOKENS = 2
# With near-copies kept, passages sharing this many tokens in a row are still copies, and dropped.
COPY_TOKENS = 16
# What one family and one package or module of it contribute at most (see ``documents``).
FAMILY_WORDS = 400_000
GROUP_WORDS = 40_000

Documents = list[list[str]]


@dataclass(frozen=True)
class Family:
    """Where a family's text is, and how to read it (see ``documents``)."""

    sources: Callable[[], list[tuple[str, str]]]  # (group, source), in any order
    read: Callable[[str], Documents]  # the documents of one source


@dataclass(frozen=True)
class Passage:
    """A passage of private text, and the family it was cut from."""

    family: str
    words: list[str]


def _read(path: str) -> str:
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data: bytes = f.read()
    return data.decode("utf-8", "replace")


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


# --- Python: docstrings, code, reference topics -------------------------------------------------

_PYTHON_SKIP = {"site-packages", "test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "encodings"}


def _python_sources() -> list[tuple[str, str]]:
    """Python modules, by top-level package: every module of the standard library of this build,
    and those of the Debian packages under /usr/lib/python3/dist-packages (pip, setuptools,
    pygments, ...; whatever is installed).

    Not the test suites, not the GUI (idlelib, tkinter, turtle), not ``encodings`` (generated
    codec tables) and not ``this`` (the Zen of Python is public text) or ``antigravity``.
    """
    out = []
    for root in (Path(sysconfig.get_paths()["stdlib"]), Path("/usr/lib/python3/dist-packages")):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            if _PYTHON_SKIP & set(parts) or parts[0].startswith("config-"):
                continue
            if parts[0] in {"this.py", "antigravity.py", "turtle.py", "__phello__"}:
                continue
            out.append((parts[0].removesuffix(".py"), str(path)))
    return out


def _parse(path: str) -> tuple[list[str], ast.Module]:
    """The lines and syntax tree of a module; none for one this Python cannot read."""
    try:
        with pytokenize.open(path) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old modules
            source = f.read()
            return source.splitlines(), ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return [], ast.Module(body=[], type_ignores=[])


_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring_node(node: ast.AST) -> ast.Expr | None:
    if isinstance(node, _WITH_DOCSTRING) and node.body:
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            return first
    return None


def _docstrings(path: str) -> Documents:
    """Docstrings of the module and of its classes, functions and methods, of 40 words or more.

    Like ``bench.corpus.docstrings`` (read from the files, never imported), but of every module,
    the submodules of packages (email, asyncio, ...) included, where that reads top-level ones only.
    """
    _, tree = _parse(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, _WITH_DOCSTRING):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and len(doc.split()) >= 40:
                out.append(doc.split())
    return out


def _code(path: str) -> Documents:
    """Top-level functions and classes (a class with its methods), code and comments, docstrings cut.

    Source code is a genre of shared idioms (``raise ValueError``, ``for i in range(len``): most of
    it is dropped as near-copies of other code unless near-copies are kept.
    """
    lines, tree = _parse(path)
    out = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        keep = set(range(start - 1, node.end_lineno or node.lineno))
        for inner in ast.walk(node):
            doc = _docstring_node(inner)
            if doc is not None:
                keep -= set(range(doc.lineno - 1, doc.end_lineno or doc.lineno))
        words = " ".join(lines[i] for i in sorted(keep)).split()
        if words:
            out.append(words)
    return out


def _topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(name, name) for name in sorted(topics)]


def _topic(name: str) -> Documents:
    """A topic of the Python language reference, as ``help()`` shows it (``pydoc_data``)."""
    from pydoc_data.topics import topics

    return [topics[name].split()]


# --- Debian: changelogs, copyright files, documentation ------------------------------------------


def _doc_files(pattern: str) -> list[tuple[str, str]]:
    """Files under /usr/share/doc matching ``pattern``, grouped by package; links skipped."""
    paths = sorted(glob.glob(f"/usr/share/doc/{pattern}", recursive=True))
    return [(p.split("/")[4], p) for p in paths if os.path.isfile(p) and not os.path.islink(p)]


def _changelog(path: str) -> Documents:
    try:
        return changelog_entries(_read(path))
    except OSError:
        return []


def changelog_entries(text: str) -> Documents:
    """Entries of a Debian changelog of 30 words or more, without e-mail addresses."""
    out = []
    for entry in text.split("\n\n"):
        words = [w for w in entry.split() if not w.startswith("<") and "@" not in w]
        if len(words) >= 30:
            out.append(words)
    return out


_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9-]*):(.*)")


def _copyright_stanzas(text: str) -> list[list[tuple[str, list[str]]]]:
    """The stanzas of a machine-readable copyright file: each a list of (field, lines), the first
    line the field's value on its own line, continuation lines unindented ('.' lines blank)."""
    stanzas: list[list[tuple[str, list[str]]]] = []
    fields: list[tuple[str, list[str]]] = []
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if fields:
                stanzas.append(fields)
                fields = []
            continue
        match = _FIELD.match(line)
        if match and not line[0].isspace():
            fields.append((match[1].lower(), [match[2].strip()]))
        elif fields:
            fields[-1][1].append("" if line.strip() == "." else line.strip())
    return stanzas


def _is_dep5(text: str) -> bool:
    return text.lower().startswith(("format:", "format-specification:"))


_LICENSE_WORDING = re.compile(r"warrant|redistribut|hereby|permission|terms of|provided .as is", re.IGNORECASE)


def _copyright(path: str) -> Documents:
    """Whose the files of a package are, without license texts.

    A machine-readable copyright file gives its ``Files``, ``Copyright`` (the holders), ``License``
    names, ``Comment`` fields and header; its license texts are public text (``public_texts``). A
    free-form one gives its paragraphs without license wording (who packaged it, from where,
    "Copyright (C) 1990-2023 Free Software Foundation, Inc."). Lists of authors and thanks
    (AUTHORS, THANKS, CREDITS, CONTRIBUTORS) are read whole.
    """
    text = _read(path)
    if not Path(path).name.startswith("copyright"):
        return [text.split()] if text.strip() else []
    if not _is_dep5(text):
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if not _LICENSE_WORDING.search(p)]
        words = " ".join(paragraphs).split()
        return [words] if words else []
    words = []
    for stanza in _copyright_stanzas(text):
        for field, lines in stanza:
            if field == "format":
                continue
            kept = lines[:1] if field == "license" else lines
            words += [f"{field.title()}:", *" ".join(kept).split()]
    return [words] if words else []


_CREDITS = re.compile(r"(AUTHORS|THANKS|CREDITS|CONTRIBUTORS)(\.(md|txt|rst))?(\.gz)?")


def _legal_sources() -> list[tuple[str, str]]:
    return [(g, p) for g, p in _doc_files("*/*") if Path(p).name == "copyright" or _CREDITS.fullmatch(Path(p).name)]


def _license_paragraphs() -> list[str]:
    """Texts of the ``License`` fields of every machine-readable copyright file, once each."""
    out, seen = [], set()
    for _, path in _doc_files("*/copyright"):
        text = _read(path)
        if not _is_dep5(text):
            continue
        for stanza in _copyright_stanzas(text):
            for field, lines in stanza:
                body = "\n".join(lines[1:]).strip()
                if field == "license" and len(body.split()) >= 20 and body not in seen:
                    seen.add(body)
                    out.append(body)
    return out


_FUNCTION_WORDS = {"the", "a", "an", "of", "to", "and", "or", "is", "are", "in", "for", "on", "with", "by", "it", "not"}


def _doc(path: str) -> Documents:
    """A README, NEWS, Markdown, reStructuredText or text file, if it reads as prose: at least
    one word in ten an English function word (not glyph tables, CMake files or data)."""
    words = _read(path).split()
    if not words or sum(w.lower() in _FUNCTION_WORDS for w in words) < len(words) / 10:
        return []
    return [words]


_DOC_NAME = re.compile(r"(README|NEWS)[^/]*|[^/]*\.(md|txt|rst)", re.IGNORECASE)


def _doc_sources() -> list[tuple[str, str]]:
    return [
        (group, path)
        for group, path in _doc_files("**/*")
        if _DOC_NAME.fullmatch(Path(path).name.removesuffix(".gz"))
        and not Path(path).name.startswith(("copyright", "changelog"))
        and not _CREDITS.fullmatch(Path(path).name)  # the ``legal`` family's
    ]


# --- manuals: man pages, GNU info, Perl POD ------------------------------------------------------


def _dpkg_owners(prefix: str) -> dict[str, str]:
    """Which installed package ships each file under ``prefix`` (from dpkg's file lists)."""
    owners = {}
    for listing in sorted(glob.glob("/var/lib/dpkg/info/*.list")):
        package = Path(listing).stem.split(":")[0]
        with open(listing, errors="replace") as f:
            for line in f:
                if line.startswith(prefix):
                    owners[line.rstrip("\n")] = package
    return owners


def _man_sources() -> list[tuple[str, str]]:
    """English man pages, sections 1-9, by package; not links, not the Perl modules' pages
    (section 3perl, 3pm: their text is the ``pod`` family's)."""
    owners = _dpkg_owners("/usr/share/man/man")
    out = []
    for path in sorted(glob.glob("/usr/share/man/man[1-9]/*")):
        name = Path(path).name.removesuffix(".gz")
        if os.path.islink(path) or name.endswith((".3perl", ".3pm")):
            continue
        out.append((owners.get(path, Path(path).name.split(".")[0]), path))
    return out


def _man(path: str) -> Documents:
    """A man page as ``man`` shows it: rendered by groff (the family is empty without groff),
    without hyphenation or line length, headers and footers cut; ``.so`` redirects skipped."""
    source = _read(path)
    if source.startswith(".so ") or shutil.which("groff") is None:
        return []
    rendered = subprocess.run(
        ["groff", "-k", "-t", "-mandoc", "-Tutf8", "-rHY=0", "-rLL=1000n", "-P-cbou"],
        input=source.encode(),
        capture_output=True,
        check=False,
        timeout=60,
    ).stdout.decode("utf-8", "replace")
    lines = [line for line in rendered.splitlines() if line.strip()]
    words = " ".join(lines[1:-1]).split()
    return [words] if words else []


def _info_sources() -> list[tuple[str, str]]:
    paths = sorted(glob.glob("/usr/share/info/*.info*"))
    return [(Path(p).name.split(".info")[0], p) for p in paths if not os.path.islink(p)]


def _info(path: str) -> Documents:
    """The nodes of a GNU info manual, of 30 words or more, without node headers and menu lines."""
    out = []
    for node in _read(path).split("\x1f")[1:]:
        lines = node.strip("\n").splitlines()
        if not lines or not lines[0].startswith("File:"):
            continue  # the tag table and the indirect table
        words = " ".join(line for line in lines[1:] if not (line.startswith("* ") and "::" in line)).split()
        if len(words) >= 30:
            out.append(words)
    return out


def _pod_sources() -> list[tuple[str, str]]:
    roots = sorted(glob.glob("/usr/share/perl/*") + glob.glob("/usr/share/perl5") + glob.glob("/usr/lib/*/perl*/"))
    out, seen = [], set()
    for root in roots:
        if os.path.islink(root.rstrip("/")):
            continue
        for path in sorted(Path(root).rglob("*.p[mo]*")):
            real = os.path.realpath(path)
            if path.suffix in (".pm", ".pod") and not path.is_symlink() and real not in seen:
                seen.add(real)
                out.append((path.relative_to(root).parts[0].removesuffix(path.suffix), str(path)))
    return out


_POD_CODE = re.compile(r"[A-Z]<(?:<+\s(.*?)\s>+|([^<>]*))>")


def _pod(path: str) -> Documents:
    """The POD documentation of a Perl module: paragraphs and examples, command words and
    formatting codes (``B<...>``, ``L<text|target>``) stripped, ``=begin``/``=for`` blocks dropped."""
    words: list[str] = []
    in_pod, block = False, ""  # block: "=begin" until "=end", "=for" until a blank line
    for line in _read(path).splitlines():
        if block == "=for" and not line.strip():
            block = ""
        if line.startswith("="):
            command, _, line = line.partition(" ")
            in_pod = command != "=cut"
            if block == "=begin" and command not in ("=end", "=cut"):
                continue
            block = command if command in ("=begin", "=for") else ""
            if command in ("=begin", "=for", "=end", "=cut", "=pod", "=over", "=back", "=encoding"):
                continue
        if in_pod and not block:
            for _ in range(3):  # nested codes: I<B<...>>
                line = _POD_CODE.sub(lambda m: (m[1] or m[2] or "").split("|")[0], line)
            words += line.split()
    return [words] if len(words) >= 30 else []


FAMILIES: dict[str, Family] = {
    # Python's standard library and Debian's Python packages, read from the files.
    "docstrings": Family(_python_sources, _docstrings),
    "code": Family(_python_sources, _code),
    "reference": Family(_topics, _topic),
    # Perl modules' documentation (perl, and the Debian packages' modules under /usr/share/perl5).
    "pod": Family(_pod_sources, _pod),
    # Debian packages: their changelogs, copyright files and documentation.
    "changelogs": Family(lambda: _doc_files("*/changelog.Debian.gz"), _changelog),
    "legal": Family(_legal_sources, _copyright),
    "docs": Family(_doc_sources, _doc),
    # Manuals of the installed commands, libraries and file formats.
    "man": Family(_man_sources, _man),
    "info": Family(_info_sources, _info),
}

SPLITS: dict[str, dict[str, tuple[str, ...]]] = {
    # Split a tunes on what programmers write in and about a programming language, and reports
    # on what Debian packages ship for their users and packagers; b is the swap. Why each is where:
    # - docstrings, reference: Python, the text the rules were first tuned on; code: the same
    #   modules, whose comments read like their docstrings;
    # - pod: the docstrings of another language (and the source of the 3perl/3pm man pages,
    #   which ``man`` leaves out for that reason);
    # - changelogs, docs: release notes, READMEs and NEWS files, which repeat changelog entries;
    # - man, info: manuals of the same commands (coreutils documents its options in both);
    # - legal: names, years, addresses and file globs, a layout none of the others has.
    # No kept passage of one side has 16 tokens in a row in common with the other side's (the
    # CLI counts them: seed 7, none); within a side, de-duplication drops what families share.
    "a": {
        "tune": ("code", "docstrings", "reference", "pod"),
        "held_out": ("changelogs", "legal", "docs", "man", "info"),
    },
    "b": {
        "tune": ("changelogs", "legal", "docs", "man", "info"),
        "held_out": ("code", "docstrings", "reference", "pod"),
    },
}


def _spread(sources: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Sources in a fixed order unrelated to their names, so a cap samples all of them."""
    return sorted(sources, key=lambda s: _digest(f"{s[0]}\0{s[1]}"))


def documents(family: str, limit_words: int = FAMILY_WORDS) -> Documents:
    """The documents of a family, exact duplicates dropped, at most ``GROUP_WORDS`` words of one
    package or module and ``limit_words`` in all (the last document of either cut short)."""
    spec = FAMILIES[family]
    out: Documents = []
    seen: set[bytes] = set()
    per_group: Counter[str] = Counter()
    total = 0
    for group, source in _spread(spec.sources()):
        if total >= limit_words:
            break
        if per_group[group] >= GROUP_WORDS:
            continue  # before reading: a man page takes groff a tenth of a second
        for words in spec.read(source):
            room = min(GROUP_WORDS - per_group[group], limit_words - total)
            if room <= 0:
                break
            key = _digest(" ".join(words))
            if key in seen:
                continue
            seen.add(key)
            out.append(words[:room])
            per_group[group] += len(out[-1])
            total += len(out[-1])
    return out


def cut(docs: Documents, rng: random.Random) -> Documents:
    """Documents cut into consecutive passages of ``PASSAGE_WORDS`` words; shorter tails dropped."""
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


# --- de-duplication ------------------------------------------------------------------------------


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


# Weights of a key's token positions: a key is the sum of its token ids times these, modulo 2**64.
_WEIGHTS = np.array([random.Random(f"key {i}").getrandbits(64) | 1 for i in range(COPY_TOKENS)], dtype=np.uint64)


class _Keys:
    """``near_copy_keys`` and ``copy_keys`` as 64-bit integers, for sets of millions of them.

    A tuple of 8 tokens costs 120 bytes and its set entry more; an integer a third of it. The
    integer is a fixed weighted sum of ids the token strings get in this object, so equal keys
    give equal integers and distinct keys collide with a chance of 2**-64 a pair: the passages
    kept are those the tuples keep, and the same in every process.
    """

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def copies(self, tokens: list[str], length: int = COPY_TOKENS) -> npt.NDArray[np.uint64]:
        """The key of each run of ``length`` (at most ``COPY_TOKENS``) tokens, in order."""
        return self._runs(self._ids(tokens), 0, length)

    def near_copies(self, tokens: list[str]) -> npt.NDArray[np.uint64]:
        ids, side = self._ids(tokens), SIDE_TOKENS
        count = len(ids) - 2 * side + 1
        if count <= 0:
            return np.zeros(0, dtype=np.uint64)
        left = self._runs(ids, 0, side)[:count]
        right = self._runs(ids[side:], side, side)  # right[j]: the run that starts at token side + j
        gaps = range(min(EDIT_TOKENS, count - 1) + 1)
        return np.concatenate([left[: count - gap] + right[gap:count] for gap in gaps])

    def _ids(self, tokens: list[str]) -> npt.NDArray[np.uint64]:
        return np.array([self.ids.setdefault(t, len(self.ids)) for t in tokens], dtype=np.uint64)

    @staticmethod
    def _runs(ids: npt.NDArray[np.uint64], first: int, width: int) -> npt.NDArray[np.uint64]:
        count = max(len(ids) - width + 1, 0)
        out = np.zeros(count, dtype=np.uint64)
        for j in range(width if count else 0):
            out += ids[j : j + count] * _WEIGHTS[first + j]
        return out


def dedup(
    passages: list[list[str]],
    *,
    near_copies: bool = False,
    public: Iterable[list[str]] = (),
    copy_tokens: int = COPY_TOKENS,
) -> list[int]:
    """Indices of the passages kept: each that shares no key with a kept one or a public text.

    The keys are ``near_copy_keys``, or with ``near_copies`` runs of ``copy_tokens`` tokens
    (``copy_keys`` at the default; see private_passages).
    """
    keys = _Keys()

    def of(tokens: list[str]) -> npt.NDArray[np.uint64]:
        return keys.copies(tokens, copy_tokens) if near_copies else keys.near_copies(tokens)

    seen: set[int] = set()
    for text in public:
        seen.update(of(tokenize(" ".join(text))).tolist())
    kept = []
    for i, words in enumerate(passages):
        mine = set(of(tokenize(" ".join(words))).tolist())
        if mine.isdisjoint(seen):
            seen |= mine
            kept.append(i)
    return kept


def _families(names: Iterable[str]) -> list[str]:
    chosen = set(names)
    if unknown := chosen - FAMILIES.keys():
        raise KeyError(f"no such families: {sorted(unknown)}")
    return [name for name in FAMILIES if name in chosen]


def private_passages(
    seed: int,
    families: Iterable[str] = tuple(FAMILIES),
    *,
    near_copies: bool = False,
    limit_words: int = FAMILY_WORDS,
    copy_tokens: int = COPY_TOKENS,
) -> list[Passage]:
    """De-duplicated passages of the chosen families, shuffled, each with its family.

    A passage is dropped when it is a near-copy of an earlier kept one, or of a public text (see
    ``corpus.private_passages`` for why: text two tenants both own is not private, and a leak of
    text the allowlist knows is no leak). Near-copy: the two share 8 tokens in a row, or 8 tokens
    around one edit of up to 2 tokens (``near_copy_keys``). With ``near_copies`` only copies are
    dropped (16 tokens in a row, ``copy_keys``), and the passages keep the short phrases and
    near-copies real documents of one genre share (code most of all); ``copy_tokens`` = 8 drops
    every passage that shares 8 tokens in a row with another, and keeps what is shorter, around
    edits or not: an overlap no copy explains (``bench/eval/run.py``'s clean traffic).

    Each family is cut with a generator of its own (seeded by ``seed`` and its name), so its
    passages before de-duplication are the same whichever families come with it; the order of
    ``families`` does not matter. Families de-duplicated together have no near-copy in common.
    """
    candidates = _candidates(seed, families, limit_words)
    public = public_texts() + held_out_public_texts()
    kept = dedup([p.words for p in candidates], near_copies=near_copies, public=public, copy_tokens=copy_tokens)
    return [candidates[i] for i in kept]


def _candidates(seed: int, families: Iterable[str], limit_words: int) -> list[Passage]:
    out = [p for name in _families(families) for p in _cut(seed, name, documents(name, limit_words))]
    random.Random(seed).shuffle(out)
    return out


def _cut(seed: int, family: str, docs: Documents) -> list[Passage]:
    return [Passage(family, words) for words in cut(docs, random.Random(f"{seed} {family}"))]


def templates(count: int, seed: int, families: Iterable[str], limit_words: int = FAMILY_WORDS) -> list[str]:
    """``count`` documents of 60 to 200 words of the families, as system prompts tenants share."""
    docs = [d for name in _families(families) for d in documents(name, limit_words) if 60 <= len(d) <= 200]
    return [" ".join(d) for d in random.Random(seed + 1).sample(docs, count)]


# --- public text ---------------------------------------------------------------------------------


def common_licenses() -> list[list[str]]:
    """The licenses in /usr/share/common-licenses and the Zen of Python (``corpus.public_texts``)."""
    texts = []
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file():
            texts.append(path.read_text(errors="replace").split())
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # prints the Zen of Python on first import
    texts.append("".join(this.d.get(c, c) for c in this.s).split())
    return [t for t in texts if len(t) >= 40]


@lru_cache(maxsize=1)
def _public_sets() -> tuple[list[list[str]], list[list[str]]]:
    """``public_texts`` and ``held_out_public_texts``.

    The license paragraphs of the copyright files fall in two sets: those that quote
    /usr/share/common-licenses (16 tokens in a row in common) or point to it ("On Debian
    systems, the complete text of the GNU General Public License version 2 can be found in
    /usr/share/common-licenses/GPL-2"), and the others: MIT/Expat, ISC, zlib, the BSD licenses
    with other wording, one-off permissions. A paragraph is kept only if it adds 16 tokens no
    paragraph before it has (so not the 300 copies of the GPL-2+ notice, nor the ones that
    differ from another by a name or a version), and none of the first has 16 tokens in a row in
    common with the second (a paragraph that quotes both, "GPL-2+ or Expat", is dropped).
    """
    keys = _Keys()
    common = common_licenses()
    runs: set[int] = set()
    for text in common:
        runs.update(keys.copies(tokenize(" ".join(text))).tolist())
    related, other = [], []
    for body in _license_paragraphs():
        words, copies = body.split(), keys.copies(tokenize(body))
        if "common-licenses" in body or not runs.isdisjoint(copies.tolist()):
            related.append((words, copies))
        else:
            other.append((words, copies))
    held_out_runs: set[int] = set()
    held_out = _adding(other, held_out_runs)
    tuned = _adding([t for t in related if held_out_runs.isdisjoint(t[1].tolist())], runs)
    return common + tuned, held_out


def _adding(texts: list[tuple[list[str], npt.NDArray[np.uint64]]], seen: set[int]) -> list[list[str]]:
    """The texts with ``COPY_TOKENS`` tokens that no run of ``seen`` or of a text kept before
    covers; ``seen`` gains the runs of those kept."""
    out = []
    for words, copies in texts:
        covered = np.zeros(len(copies) + COPY_TOKENS - 1, dtype=bool)
        for i, key in enumerate(copies.tolist()):
            if key in seen:
                covered[i : i + COPY_TOKENS] = True
        if len(covered) - covered.sum() >= COPY_TOKENS:
            out.append(words)
            seen.update(copies.tolist())
    return out


def public_texts() -> list[list[str]]:
    """Public text tenants quote, for tuning: the licenses in /usr/share/common-licenses, the Zen
    of Python, and the copyright files' license paragraphs that quote or point to those licenses."""
    return list(_public_sets()[0])


def held_out_public_texts() -> list[list[str]]:
    """Other public text, for held-out runs: the copyright files' other license paragraphs, none
    with 16 tokens in a row in common with ``public_texts``."""
    return list(_public_sets()[1])


def main() -> None:
    p = argparse.ArgumentParser(description="What each corpus family holds, and samples of its passages.")
    p.add_argument("families", nargs="*", default=list(FAMILIES))
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--limit-words", type=int, default=FAMILY_WORDS)
    args = p.parse_args()
    public = public_texts() + held_out_public_texts()
    rng = random.Random(args.seed)
    kept: dict[str, list[Passage]] = {}
    print("family      documents     words passages   kept     words  kept* seconds")
    for name in _families(args.families):
        start = time.monotonic()
        docs = documents(name, args.limit_words)
        candidates = _cut(args.seed, name, docs)
        random.Random(args.seed).shuffle(candidates)  # as private_passages(seed, [name]) does
        texts = [c.words for c in candidates]
        kept[name] = [candidates[i] for i in dedup(texts, public=public)]
        loose = len(dedup(texts, near_copies=True, public=public))
        took = time.monotonic() - start
        words, kept_words = sum(map(len, docs)), sum(len(p.words) for p in kept[name])
        row = f"{len(docs):>9,} {words:>9,} {len(candidates):>8,} {len(kept[name]):>6,} {kept_words:>9,} {loose:>6,}"
        print(f"{name:<11} {row} {took:>7.1f}")
        for passage in rng.sample(kept[name], min(3, len(kept[name]))):
            print("    " + " ".join(passage.words[:30]))
        sys.stdout.flush()
    print("kept: passages and words left when near-copies are dropped (the default); kept*: when only copies are")
    for label, texts in (("public_texts", public_texts()), ("held_out_public_texts", held_out_public_texts())):
        print(f"{label}: {len(texts)} texts, {sum(map(len, texts)):,} words")
        for text in rng.sample(texts, min(3, len(texts))):
            print("    " + " ".join(text[:30]))
    print("kept passages with 16 tokens in a row in common with another family's kept passages:")
    keys = _Keys()
    runs = {name: [set(keys.copies(tokenize(" ".join(p.words))).tolist()) for p in ps] for name, ps in kept.items()}
    union = {name: set().union(*r) for name, r in runs.items()}
    for name, mine in runs.items():
        shared = {other: sum(not r.isdisjoint(union[other]) for r in mine) for other in runs if other != name}
        print(f"    {name:<11} " + (", ".join(f"{other} {n}" for other, n in shared.items() if n) or "none"))
    for split, sides in SPLITS.items():
        print(f"split {split}: " + "; ".join(f"{side} {', '.join(names)}" for side, names in sides.items()))


if __name__ == "__main__":
    main()
