"""The gateway side of the allowlist: text in, one entry of distinct fingerprints out, in chunks.

Text is fingerprinted here with the gateway's key, with every shingle (``w = 1``): a response is
checked fingerprint by fingerprint, and a winnowed allowlist would hold about a third of the
shingles of a quote, so whether a quoted passage were suppressed would depend on which ones
the response's own winnowing kept. Every shingle covers responses fingerprinted with any ``w``.
The entry is still registered under the key id of the gateways' ``(n, w)``, which is what
responses are compared under.

Values are deduplicated here (across files and chunks) and sent ``REQUEST_FINGERPRINTS`` at a
time: the first request creates the entry, the next ones add to it, so a corpus of any size is
one entry while each request stays well under the ingest body limit. Memory here is 8 bytes per
distinct fingerprint sent, plus one chunk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.encoding import U64_LE, encode
from bleedwatch.fingerprint.scheme import Params, fingerprint_text, key_id
from service.allowlist.packed import sorted_unique, without

REQUEST_FINGERPRINTS = 1_000_000  # 8 MB of values, 10.7 MB as base64: a third of the default body limit
BLOCK_CHARS = 1 << 22  # a file is fingerprinted this many characters at a time
OVERLAP_CHARS = 4096  # ... each block starting this far back, so no shingle is cut in two
SNIFF_BYTES = 8192  # a NUL byte in a file's first 8 KiB: binary, skipped (what git does)


def every_shingle(gateway: Params) -> Params:
    return Params(n=gateway.n, w=1, sample_mod=1)


class Refused(RuntimeError):
    """bleedwatch answered 4xx or 5xx; the message is the call and the service's ``error: detail``."""


def check(resp: httpx.Response) -> dict[str, Any]:
    """The JSON answer, or ``Refused``."""
    if resp.status_code >= 400:
        try:
            body = resp.json()
            detail = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            detail = resp.text[:200]
        raise Refused(f"{resp.request.method} {resp.request.url.path} -> {resp.status_code} {detail}")
    try:
        data: dict[str, Any] = resp.json()
    except ValueError:
        raise Refused(
            f"{resp.request.method} {resp.request.url.path} -> {resp.status_code} but not JSON: is this bleedwatch?"
        ) from None
    return data


class EntryUpload:
    """One allowlist entry, built from texts as they come: ``add`` each, then ``finish``."""

    def __init__(
        self,
        client: httpx.Client,
        key: bytes,
        gateway: Params,
        label: str,
        *,
        entry: dict[str, Any] | None = None,
        chunk: int | None = None,
    ) -> None:
        self.client, self.key, self.label = client, key, label
        self.chunk = chunk or REQUEST_FINGERPRINTS
        self.key_id = key_id(key, gateway)
        self.params = every_shingle(gateway)
        self.entry = entry  # as bleedwatch last answered; None until the first chunk is sent
        self.texts = 0
        self.sent = 0
        self._sent: list[npt.NDArray[np.uint64]] = []  # sorted, disjoint, decreasing in size
        self._pending: list[npt.NDArray[np.uint64]] = []
        self._pending_count = 0

    def add(self, text: str) -> None:
        self.texts += 1
        self.add_values(fingerprint_text(text, self.key, self.params).values)

    def add_values(self, values: npt.NDArray[np.uint64]) -> None:
        """Fingerprints made with ``self.params``; sent once a chunk's worth of new ones is here."""
        self._pending.append(values)
        self._pending_count += len(values)
        if self._pending_count >= self.chunk:
            self._send(final=False)

    def finish(self) -> dict[str, Any] | None:
        """Send what is left; the entry as bleedwatch holds it, or None if there was nothing to send."""
        self._send(final=True)
        return self.entry

    def _send(self, *, final: bool) -> None:
        new = without(sorted_unique(self._pending), self._sent)
        start = 0
        while len(new) - start >= self.chunk or (final and start < len(new)):
            part = new[start : start + self.chunk]
            body = {"fingerprints": encode(part, U64_LE)}
            if self.entry is None:
                self.entry = check(self.client.post("/v1/allowlist", json=body | self._head()))
            else:
                self.entry = check(self.client.post(f"/v1/allowlist/{self.entry['id']}/fingerprints", json=body))
            self._remember(part)
            self.sent += len(part)
            start += len(part)
        self._pending = [new[start:]]
        self._pending_count = len(new) - start

    def _remember(self, part: npt.NDArray[np.uint64]) -> None:
        """Keep what was sent as a few sorted arrays, merged like a binary counter: each later
        chunk is checked against log2(chunks) of them, and each value is merged log2 times."""
        self._sent.append(part)
        while len(self._sent) > 1 and len(self._sent[-2]) < 2 * len(self._sent[-1]):
            last = self._sent.pop()
            merged = np.concatenate([self._sent.pop(), last])
            merged.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
            self._sent.append(merged)

    def _head(self) -> dict[str, str]:
        return {"key_id": self.key_id, "label": self.label}


def text_files(paths: list[Path]) -> Iterator[Path]:
    """The files named, and every file under the directories named, in name order.

    Hidden files and directories (``.git``) and binary files are skipped.
    """
    for path in paths:
        if not path.is_dir():
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                file = Path(root) / name
                if not name.startswith(".") and file.is_file() and _is_text(file):
                    yield file


def _is_text(path: Path) -> bool:
    with path.open("rb") as f:
        return b"\0" not in f.read(SNIFF_BYTES)


def blocks(path: Path, block_chars: int = BLOCK_CHARS, overlap: int = OVERLAP_CHARS) -> Iterator[str]:
    """A file's text in pieces of about ``block_chars``, each starting ``overlap`` or less into the last.

    Cuts fall on whitespace where there is any, so every shingle lies whole in some piece; the
    overlap repeats a few shingles, which deduplication removes.
    """
    if not 0 < overlap < block_chars:
        raise ValueError("the overlap must be positive and shorter than a block")
    with path.open(encoding="utf-8", errors="replace") as f:
        carry = ""
        while True:
            block = f.read(block_chars)
            text = carry + block
            if len(block) < block_chars:  # the end of the file
                if text:
                    yield text
                return
            cut = _after_last_space(text, len(text) - overlap, len(text))
            yield text[:cut]
            carry = text[_after_last_space(text, cut - overlap, cut - overlap // 2) :]


def _after_last_space(text: str, lo: int, hi: int) -> int:
    """The position after the last whitespace in text[lo:hi], or hi if there is none."""
    lo, hi = max(lo, 0), max(hi, 0)
    for i in range(hi - 1, lo - 1, -1):
        if text[i].isspace():
            return i + 1
    return hi
