"""A bounded local file of batches the service could not take, replayed when it is back.

The gateway keeps serving while bleedwatch is unreachable; what the SDK could not deliver goes
here instead of being dropped, and only a full spool drops (the client counts and reports every
drop). The file is append-only, a sequence of records::

    magic "BWs2" | length u32 | exchanges u32 | CRC-32 of length, exchanges and payload u32 | payload

all big-endian; the payload is the batch's JSON body. A record that fails its check is skipped
and counted (``skipped_records``), never taken as the end of the file: the next record is found
by its magic, so one bad sector costs one batch, not everything after it. Only a bad tail with
no whole record after it (a crash in the middle of an append) is cut off.

What is counted is records, not exchanges: a bad record's exchange count is in the header its CRC
failed to vouch for (a garbled one could read as billions). A bad stretch between two whole records
counts each record in it, as far as the format tells where they start: a bad record whose magic is
intact and whose length ends exactly at a magic (or at the stretch's end) is framed by that length;
otherwise the next occurrence of the magic is taken as the next record. So a record with a garbled
magic is counted with the one before it, and a garbled header followed by a payload that happens to
hold the magic's four bytes counts one record too many. Files of the earlier
layout (no magic) are read once and rewritten in this one.

Delivered records are skipped, not rewritten: ``<path>.offset`` holds ``generation offset``, the
byte offset of the first undelivered record (replaced atomically after each delivery). Once
everything is delivered the generation goes up and the file is truncated to zero. An offset
that is not where a record starts (a stale file, one from before a crash or of another file) is
repaired to the record boundary before it, so at worst a batch is sent twice, which the service
reports as duplicates (ingest is idempotent); a record is never skipped because of the offset.

Durability (``fsync``): ``"always"`` (the default) fsyncs the file after every append and the
offset file after every update, and the directory after a file is created or replaced, so a
spooled batch survives a power loss; ``"never"`` leaves it to the operating system (a crash of
the process alone loses nothing either way). Appends only happen while the service is
unreachable, so the cost of ``always`` is paid rarely. Files are created with mode 0600 (the
payloads are fingerprints, but of the gateway's tenants' traffic) in a directory of mode 0700.

Shared safely: every operation holds an exclusive ``flock`` on ``<path>.lock`` and first reads
what other processes did (their appends, deliveries, truncations), so the workers of one gateway
may be given the same path. Two processes may send the same record (a duplicate, harmless);
neither can corrupt the file. Within a process a lock serialises the client's worker threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MAGIC = b"BWs2"
HEADER = struct.Struct(">4sIII")
_CHECKED = struct.Struct(">II")  # length and exchanges, covered by the CRC with the payload
_LEGACY_HEADER = struct.Struct(">III")  # length, exchanges, CRC-32 of the payload (no magic)
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
FILE_MODE = 0o600
DIR_MODE = 0o700


@dataclass(frozen=True, slots=True)
class Record:
    end: int  # offset just past this record: commit(end) marks it delivered
    exchanges: int
    payload: bytes
    generation: int = 0  # the file's generation when read: a commit from an older one is ignored


def _crc(length: int, exchanges: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_CHECKED.pack(length, exchanges)))


def encode_record(payload: bytes, exchanges: int) -> bytes:
    return HEADER.pack(MAGIC, len(payload), exchanges, _crc(len(payload), exchanges, payload)) + payload


class Spool:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fsync: Literal["always", "never"] = "always",
    ) -> None:
        if max_bytes < HEADER.size + 1:
            raise ValueError("max_bytes is too small for even one record")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        self._mutex = threading.Lock()
        self._offset_path = self.path.with_name(self.path.name + ".offset")
        self._lock_fd = self._open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR)
        self._file = os.fdopen(self._open(self.path, os.O_RDWR), "r+b")
        self._generation = -1  # what this process last saw on disk; -1: nothing yet
        self._start = self._end = self._pending = 0
        self.skipped_records = 0  # records that failed their check and were skipped (or a torn tail cut); not exchanges
        self.repaired_offsets = 0  # times the offset file was stale or unreadable and was rewritten
        self._bad: set[tuple[int, int]] = set()  # (generation, offset) of bad records counted already
        with self._locked():
            self._sync()

    # --- state ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Bytes on disk, delivered records included (the cap applies to this)."""
        return self._end

    @property
    def pending_exchanges(self) -> int:
        return self._pending

    def __bool__(self) -> bool:
        """Anything undelivered, as far as this process knows, or the file changed (another process
        appended): a cheap look, without the lock; ``peek`` says for sure."""
        if self._file.closed:
            return False
        return self._start < self._end or os.fstat(self._file.fileno()).st_size != self._end

    # --- writing --------------------------------------------------------------------------
    def append(self, payload: bytes, exchanges: int) -> bool:
        """Keep one batch; False (and nothing written) when it would pass ``max_bytes``."""
        with self._locked():
            self._sync()
            record = encode_record(payload, exchanges)
            if self._end + len(record) > self.max_bytes:
                return False
            self._file.seek(self._end)
            self._file.write(record)
            self._file.flush()
            if self.fsync == "always":
                os.fsync(self._file.fileno())
            self._end += len(record)
            self._pending += exchanges
            return True

    # --- replay ---------------------------------------------------------------------------
    def peek(self) -> Record | None:
        """The oldest undelivered batch, or None."""
        with self._locked():
            self._sync()
            while self._start < self._end:
                record = self._read_at(self._start)
                if record is not None:
                    return record
                # Skipped and counted (once), and on to the next whole record.
                nxt = self._next_record(self._start + 1, self._end) or self._end
                self._skip(self._start, nxt)
                self._commit(nxt)
            return None

    def commit(self, end: int, generation: int | None = None) -> None:
        """Everything before ``end`` (a ``Record.end``) is delivered. A commit another process made
        already, or one of a generation since truncated (``Record.generation``), changes nothing."""
        with self._locked():
            self._sync()
            if (generation is not None and generation != self._generation) or end <= self._start:
                return
            if end > self._end:
                raise ValueError("commit offset outside the undelivered records")
            self._commit(end)

    def close(self) -> None:
        """Idempotent: a second close must not close a descriptor number the process has reused."""
        with self._mutex:
            if self._lock_fd < 0:
                return
            self._file.close()
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- internals ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _open(self, path: Path, flags: int) -> int:
        """Created with mode 0600 (and the directory fsynced, so the new name survives a power loss);
        an existing file is brought to 0600."""
        created = False
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
            created = True
        os.fchmod(fd, FILE_MODE)
        if created:
            self._fsync_dir()
        return fd

    def _fsync_dir(self) -> None:
        if self.fsync != "always":
            return
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _commit(self, end: int) -> None:
        record = self._read_at(self._start)
        offset = self._start
        while offset < end:
            if record is None:  # a bad record between: skipped by its magic, as the scan does
                offset = self._next_record(offset + 1, end) or end
            else:
                self._pending -= record.exchanges
                offset = record.end
            record = self._read_at(offset) if offset < end else None
        self._start = end
        if self._start == self._end:  # all delivered: a new generation, from an empty file
            self._generation += 1
            self._start = self._end = self._pending = 0
            self._write_offset()  # first: a crash before the truncation replays, never skips
            self._file.truncate(0)
            self._file.flush()
            if self.fsync == "always":
                os.fsync(self._file.fileno())
            return
        self._write_offset()

    def _sync(self) -> None:
        """Catch up with the files on disk: what another process (or an earlier life of this one)
        appended, delivered or truncated. Cheap when nothing changed or records were only added."""
        generation, start, readable = self._read_offset()
        size = os.fstat(self._file.fileno()).st_size
        if (generation, start, size) == (self._generation, self._start, self._end) and readable:
            return
        if generation == self._generation and self._start <= start <= self._end <= size and readable:
            self._pending -= self._exchanges_between(self._start, start)
            self._start = start
            if size > self._end:  # appended by another process, or torn by a crash in the middle of it
                added, good_end = self._scan(self._end, size)
                self._pending += sum(exchanges for _, exchanges in added)
                self._end = self._cut(good_end, size)
            return
        self._rescan(generation, start, size, readable)

    def _rescan(self, generation: int, start: int, size: int, readable: bool) -> None:
        """Read the whole file: where its records are, where the first undelivered one starts."""
        self._generation = max(generation, 0)
        if size and self._is_legacy():
            size = self._migrate(size)
        records, good_end = self._scan(0, size)
        self._end = self._cut(good_end, size)
        starts = [offset for offset, _ in records]
        repaired = start
        if start > self._end:  # from an older generation of the file: replay it all
            repaired = 0
        elif start != self._end and start not in set(starts):
            repaired = max((s for s in starts if s <= start), default=0)
        self._start = repaired
        self._pending = sum(exchanges for offset, exchanges in records if offset >= repaired)
        if repaired != start or not readable:
            self.repaired_offsets += 1
            self._write_offset()

    def _scan(self, offset: int, size: int) -> tuple[list[tuple[int, int]], int]:
        """The whole records from ``offset`` (their offsets and exchanges), skipping and counting
        bad ones, and the end of the last whole one."""
        records: list[tuple[int, int]] = []
        good_end = offset
        while offset < size:
            record = self._read_at(offset)
            if record is None:
                nxt = self._next_record(offset + 1, size)
                self._skip(offset, size if nxt is None else nxt)
                if nxt is None:
                    break
                offset = nxt
                continue
            records.append((offset, record.exchanges))
            offset = good_end = record.end
        return records, good_end

    def _skip(self, start: int, end: int) -> None:
        """Count each record in the bad stretch ``[start, end)`` once, whichever of the scan or the
        replay reaches it first (both begin a stretch at the end of the whole record before it)."""
        for offset in self._bad_record_starts(start, end):
            if (self._generation, offset) not in self._bad:
                self._bad.add((self._generation, offset))
                self.skipped_records += 1

    def _bad_record_starts(self, start: int, end: int) -> list[int]:
        """Where the records of a bad stretch begin, as far as the format tells (module docstring):
        their count is what was lost, however many sit side by side."""
        starts: list[int] = []
        with mmap.mmap(self._file.fileno(), end, access=mmap.ACCESS_READ) as view:
            offset = start
            while offset < end:
                starts.append(offset)
                nxt = -1
                if view[offset : offset + len(MAGIC)] == MAGIC and offset + HEADER.size <= end:
                    framed = offset + HEADER.size + HEADER.unpack_from(view, offset)[1]
                    if framed == end or view[framed : framed + len(MAGIC)] == MAGIC:
                        nxt = framed
                if nxt < 0:
                    nxt = view.find(MAGIC, offset + 1, end)
                offset = end if nxt < 0 else nxt
        return starts

    def _cut(self, good_end: int, size: int) -> int:
        """Cut a bad tail (nothing whole after it: a crash in the middle of an append)."""
        if good_end < size:
            self._file.truncate(good_end)
            self._file.flush()
            if self.fsync == "always":
                os.fsync(self._file.fileno())
        return good_end

    def _next_record(self, offset: int, size: int) -> int | None:
        """Where the next whole record starts at or after ``offset``, found by its magic; None if none."""
        if offset >= size:
            return None
        with mmap.mmap(self._file.fileno(), size, access=mmap.ACCESS_READ) as view:
            while (found := view.find(MAGIC, offset, size)) != -1:
                if self._read_at(found) is not None:
                    return found
                offset = found + 1
        return None

    def _exchanges_between(self, start: int, end: int) -> int:
        total, offset = 0, start
        while offset < end:
            record = self._read_at(offset)
            if record is None:
                offset = self._next_record(offset + 1, end) or end
                continue
            total += record.exchanges
            offset = record.end
        return total

    def _is_legacy(self) -> bool:
        """Written in the earlier layout: its first record is whole in it (a first record of this
        layout that went bad is skipped like any other, not read as the earlier layout)."""
        self._file.seek(0)
        head = self._file.read(_LEGACY_HEADER.size)
        if len(head) < _LEGACY_HEADER.size or head.startswith(MAGIC):
            return False
        length, _, crc = _LEGACY_HEADER.unpack(head)
        payload = self._file.read(length)
        return len(payload) == length and zlib.crc32(payload) == int(crc)

    def _read_at(self, offset: int) -> Record | None:
        self._file.seek(offset)
        head = self._file.read(HEADER.size)
        if len(head) < HEADER.size:
            return None
        magic, length, exchanges, crc = HEADER.unpack(head)
        if magic != MAGIC:
            return None
        payload = self._file.read(length)
        if len(payload) < length or _crc(length, exchanges, payload) != crc:
            return None
        return Record(offset + HEADER.size + length, exchanges, payload, self._generation)

    def _migrate(self, size: int) -> int:
        """A file of the earlier layout (no magic): its whole records, rewritten in this one."""
        kept: list[bytes] = []
        offset = 0
        self._file.seek(0)
        data = self._file.read(size)
        while offset + _LEGACY_HEADER.size <= size:
            length, exchanges, crc = _LEGACY_HEADER.unpack_from(data, offset)
            payload = data[offset + _LEGACY_HEADER.size : offset + _LEGACY_HEADER.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                self.skipped_records += 1
                break
            kept.append(encode_record(payload, exchanges))
            offset += _LEGACY_HEADER.size + length
        self._file.seek(0)
        self._file.truncate(0)
        self._file.write(b"".join(kept))
        self._file.flush()
        if self.fsync == "always":
            os.fsync(self._file.fileno())
        return self._file.tell()

    def _read_offset(self) -> tuple[int, int, bool]:
        """``(generation, offset, readable)``; a missing file is generation 0, offset 0."""
        try:
            parts = self._offset_path.read_text().split()
        except FileNotFoundError:
            return max(self._generation, 0), 0, True
        try:
            if len(parts) == 1:  # the earlier layout: an offset alone
                return 0, int(parts[0]), True
            generation, offset = (int(p) for p in parts)
        except ValueError:
            return max(self._generation, 0), 0, False
        if generation < 0 or offset < 0:
            return max(self._generation, 0), 0, False
        return generation, offset, True

    def _write_offset(self) -> None:
        tmp = self._offset_path.with_name(self._offset_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(f"{self._generation} {self._start}\n")
            f.flush()
            if self.fsync == "always":
                os.fsync(f.fileno())
        os.replace(tmp, self._offset_path)
        self._fsync_dir()
