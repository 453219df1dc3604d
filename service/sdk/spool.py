"""A bounded local file of batches the service could not take, replayed when it is back.

The gateway keeps serving while bleedwatch is unreachable; what the SDK could not deliver goes
here instead of being dropped, and only a full spool drops (the client counts and reports every
drop). The file is append-only, a sequence of records::

    length u32 | exchanges u32 | CRC-32 of the payload u32 | payload (the batch's JSON body)

all big-endian. A crash in the middle of an append leaves a torn last record, which fails its
length or CRC check and is cut off when the spool is opened again: every whole record survives.

Delivered records are skipped, not rewritten: ``<path>.offset`` holds the byte offset of the
first undelivered record (replaced atomically after each delivery). Once everything is
delivered the file is truncated to zero. A crash between a delivery and its offset update
replays that record once more, which the service reports as duplicates (ingest is idempotent).

Durability (``fsync``): ``"always"`` (the default) fsyncs the file after every append and the
offset file after every update, so a spooled batch survives a power loss; ``"never"`` leaves it
to the operating system (a crash of the process alone loses nothing either way). Appends only
happen while the service is unreachable, so the cost of ``always`` is paid rarely.

Thread-safe (one lock): the client calls it from worker threads, never on its event loop.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

HEADER = struct.Struct(">III")
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Record:
    end: int  # offset just past this record: commit(end) marks it delivered
    exchanges: int
    payload: bytes


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._mutex = threading.Lock()
        self._offset_path = self.path.with_name(self.path.name + ".offset")
        self._file = open(self.path, "a+b")  # noqa: SIM115 - held open for the spool's life
        self._start = self._read_offset()
        self._end = self._recover()
        self._pending = self._count()

    # --- state ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Bytes on disk, delivered records included (the cap applies to this)."""
        return self._end

    @property
    def pending_exchanges(self) -> int:
        return self._pending

    def __bool__(self) -> bool:
        return self._start < self._end

    # --- writing --------------------------------------------------------------------------
    def append(self, payload: bytes, exchanges: int) -> bool:
        """Keep one batch; False (and nothing written) when it would pass ``max_bytes``."""
        with self._mutex:
            return self._append(payload, exchanges)

    def _append(self, payload: bytes, exchanges: int) -> bool:
        record = HEADER.pack(len(payload), exchanges, zlib.crc32(payload)) + payload
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
        with self._mutex:
            if self._start >= self._end:
                return None
            return self._read_at(self._start)

    def commit(self, end: int) -> None:
        """Everything before ``end`` (a ``Record.end``) is delivered."""
        with self._mutex:
            self._commit(end)

    def _commit(self, end: int) -> None:
        if not self._start < end <= self._end:
            raise ValueError("commit offset outside the undelivered records")
        record = self._read_at(self._start)
        while record is not None and record.end <= end:
            self._pending -= record.exchanges
            if record.end == end:
                break
            record = self._read_at(record.end)
        self._start = end
        if self._start == self._end:  # all delivered: start over with an empty file
            self._file.truncate(0)
            self._file.flush()
            if self.fsync == "always":
                os.fsync(self._file.fileno())
            self._start = self._end = 0
            self._offset_path.unlink(missing_ok=True)
            return
        self._write_offset(self._start)

    def close(self) -> None:
        with self._mutex:
            self._file.close()

    # --- internals ------------------------------------------------------------------------
    def _read_at(self, offset: int) -> Record | None:
        self._file.seek(offset)
        head = self._file.read(HEADER.size)
        if len(head) < HEADER.size:
            return None
        length, exchanges, crc = HEADER.unpack(head)
        payload = self._file.read(length)
        if len(payload) < length or zlib.crc32(payload) != crc:
            return None
        return Record(offset + HEADER.size + length, exchanges, payload)

    def _recover(self) -> int:
        """The end of the last whole record; a torn tail is cut off."""
        size = self._file.seek(0, os.SEEK_END)
        offset = 0 if self._start > size else self._start
        if offset == 0 and self._start:
            self._start = 0  # the offset file is from another file: replay it all
        while offset < size:
            record = self._read_at(offset)
            if record is None:
                break
            offset = record.end
        if offset < size:
            self._file.truncate(offset)
            self._file.flush()
        return offset

    def _count(self) -> int:
        total, offset = 0, self._start
        while offset < self._end:
            record = self._read_at(offset)
            if record is None:
                break
            total += record.exchanges
            offset = record.end
        return total

    def _read_offset(self) -> int:
        try:
            return int(self._offset_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_offset(self, offset: int) -> None:
        tmp = self._offset_path.with_name(self._offset_path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(offset))
            f.flush()
            if self.fsync == "always":
                os.fsync(f.fileno())
        os.replace(tmp, self._offset_path)
