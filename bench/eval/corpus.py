"""Text for the evaluation, all of it shipped with Python or Debian, none written by us.

- private passages: stdlib docstrings, the Python reference topics (pydoc_data) and Debian
  package changelogs, cut into passages and de-duplicated: a passage that shares 8 tokens in
  a row with an earlier one is dropped, since text two tenants both own is not private and
  would make the ground truth ambiguous;
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
OVERLAP_TOKENS = 8


def _pydoc_topics() -> list[list[str]]:
    from pydoc_data.topics import topics

    return [t.split() for t in topics.values()]


def _changelogs(limit_words: int) -> list[list[str]]:
    out, total = [], 0
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
        try:
            with gzip.open(path) as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        for entry in text.split("\n\n"):
            words = [w for w in entry.split() if not w.startswith("<") and "@" not in w]
            if len(words) >= 30:
                out.append(words)
                total += len(words)
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


def private_passages(seed: int, changelog_words: int = 3_000_000) -> list[list[str]]:
    """De-duplicated passages, shuffled: no two share a run of ``OVERLAP_TOKENS`` tokens.

    That is stricter than what makes a finding (two fingerprints in 12 tokens), so text two
    tenants happen to both own is left out instead of being scored as a false positive.
    """
    rng = random.Random(seed)
    candidates = _passages(docstrings() + _pydoc_topics() + _changelogs(changelog_words), rng)
    rng.shuffle(candidates)
    seen: set[int] = set()
    kept: list[list[str]] = []
    for words in candidates:
        tokens = tokenize(" ".join(words))
        grams = {hash(tuple(tokens[i : i + OVERLAP_TOKENS])) for i in range(len(tokens) - OVERLAP_TOKENS + 1)}
        if grams & seen:
            continue
        seen |= grams
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
