"""The SDK's spool (a bounded local file) and what the client does when the service is away."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bleedwatch import hashing
from bleedwatch.client import LONG_TEXT_CHARS, BleedwatchClient, Undelivered
from bleedwatch.exchange import Scalar, fingerprint_exchange
from bleedwatch.fingerprint.scheme import Params
from bleedwatch.spool import HEADER, MAGIC, Spool
from service import metrics
from service.auth.keys import Role
from service.local_server import free_port
from tests.aux_venv import SDK
from tests.conftest import Api, failed_attempts
from tests.traffic import KEY, exchange, words

pytestmark = pytest.mark.anyio


def test_records_survive_reopening_and_delivered_ones_stay_delivered(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.spool")
    assert spool.append(b'{"exchanges":[1]}', 1)
    assert spool.append(b'{"exchanges":[2,3]}', 2)
    assert spool.pending_exchanges == 3
    first = spool.peek()
    assert first is not None
    assert (first.payload, first.exchanges) == (b'{"exchanges":[1]}', 1)
    spool.commit(first.end)
    spool.close()

    again = Spool(tmp_path / "s.spool")
    assert again.pending_exchanges == 2
    second = again.peek()
    assert second is not None
    assert second.payload == b'{"exchanges":[2,3]}'
    again.commit(second.end)
    assert not again
    assert again.size == 0  # everything delivered: the file starts over
    assert again.peek() is None
    again.close()


def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "s.spool"
    spool = Spool(path)
    spool.append(b"whole", 1)
    spool.close()
    with open(path, "ab") as f:  # a crash in the middle of the next append
        f.write(HEADER.pack(MAGIC, 100, 1, 0) + b"only part of it")
    again = Spool(path)
    record = again.peek()
    assert record is not None
    assert record.payload == b"whole"
    assert again.size == record.end == path.stat().st_size
    assert again.append(b"next", 1)
    again.commit(record.end)
    nxt = again.peek()
    assert nxt is not None
    assert nxt.payload == b"next"
    again.close()


def test_the_cap_refuses_appends_that_would_pass_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.spool", max_bytes=HEADER.size * 2 + 10, fsync="never")
    assert spool.append(b"12345", 1)
    assert not spool.append(b"123456", 1)  # one byte too many
    assert spool.append(b"12345", 1)
    assert not spool.append(b"", 1)
    assert spool.pending_exchanges == 2
    spool.close()


def _records(spool: Spool) -> list[bytes]:
    """Every undelivered payload, delivering each (the spool is then empty)."""
    out = []
    while (record := spool.peek()) is not None:
        out.append(record.payload)
        spool.commit(record.end, record.generation)
    return out


@pytest.mark.parametrize("damage", ["payload", "length"])
def test_a_bad_record_is_skipped_and_counted_not_taken_as_the_end(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s.spool"
    spool = Spool(path, fsync="never")
    for payload in (b"first", b"second", b"third"):
        assert spool.append(payload, 1)
    spool.close()
    data = bytearray(path.read_bytes())
    second = HEADER.size + len(b"first")
    if damage == "payload":
        data[second + HEADER.size] ^= 0xFF
    else:  # its length now points past the file: only the magic of the next record finds it
        data[second + 4 : second + 8] = (10**6).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    again = Spool(path, fsync="never")
    assert again.skipped_records == 1
    assert again.pending_exchanges == 2
    assert again.size == len(data)  # nothing cut: the third record is kept
    assert _records(again) == [b"first", b"third"]
    again.close()


def test_a_record_that_goes_bad_after_opening_is_skipped_too(tmp_path: Path) -> None:
    path = tmp_path / "s.spool"
    spool = Spool(path, fsync="never")
    spool.append(b"first", 1)
    spool.append(b"second", 1)
    with open(path, "r+b") as f:
        f.seek(HEADER.size)
        f.write(b"F")
    assert _records(spool) == [b"second"]
    assert spool.skipped_records == 1
    spool.close()


def _damage_adjacent_records(path: Path, payloads: list[bytes], bad: range) -> None:
    """Garble the records at the indexes in ``bad``: the first two in their payloads (their headers
    still frame them), the last in its length (it points past the file: only the magic of the next
    good record ends it)."""
    data = bytearray(path.read_bytes())
    starts = [sum(HEADER.size + len(p) for p in payloads[:i]) for i in range(len(payloads))]
    for i in bad:
        if i == bad[-1]:
            data[starts[i] + 4 : starts[i] + 8] = (10**6).to_bytes(4, "big")
        else:
            data[starts[i] + HEADER.size] ^= 0xFF
    with open(path, "r+b") as f:  # in place: a spool already open sees the same file
        f.write(bytes(data))


@pytest.mark.parametrize("when", ["before opening", "after opening"])
@pytest.mark.parametrize("adjacent", [2, 3])
def test_adjacent_bad_records_are_counted_each(tmp_path: Path, when: str, adjacent: int) -> None:
    """Neighbouring bad records were skipped as one stretch and counted as one record lost."""
    path = tmp_path / "s.spool"
    payloads = [b"good-1", *(f"lost-{i}".encode() for i in range(adjacent)), b"good-2", b"good-3"]
    spool = Spool(path, fsync="never")
    for payload in payloads:
        assert spool.append(payload, 2)
    if when == "before opening":
        spool.close()
        _damage_adjacent_records(path, payloads, range(1, 1 + adjacent))
        spool = Spool(path, fsync="never")
        assert spool.skipped_records == adjacent  # counted by the scan at opening
        assert spool.pending_exchanges == 6
    else:
        _damage_adjacent_records(path, payloads, range(1, 1 + adjacent))
    assert _records(spool) == [b"good-1", b"good-2", b"good-3"]
    assert spool.skipped_records == adjacent  # and not again when replay reaches them
    spool.close()


@pytest.mark.parametrize(
    ("offset_text", "replayed"),
    [
        ("0 3", [b"first", b"second"]),  # not where a record starts: back to the one it is in
        ("0 99999", [b"first", b"second"]),  # past the end: of an older file, so all of it
        ("garbage", [b"first", b"second"]),
        ("7 FIRST_END", [b"second"]),  # a good one (any generation) is kept
    ],
)
def test_a_stale_offset_file_is_repaired(tmp_path: Path, offset_text: str, replayed: list[bytes]) -> None:
    path = tmp_path / "s.spool"
    spool = Spool(path, fsync="never")
    spool.append(b"first", 1)
    spool.append(b"second", 1)
    spool.close()
    offset_path = tmp_path / "s.spool.offset"
    offset_path.write_text(offset_text.replace("FIRST_END", str(HEADER.size + len(b"first"))))
    again = Spool(path, fsync="never")
    assert again.repaired_offsets == (offset_text != "7 FIRST_END")
    assert offset_path.read_text().split()[1] == ("0" if len(replayed) == 2 else str(HEADER.size + 5))
    assert _records(again) == replayed
    again.close()


def test_an_earlier_layout_is_read_and_rewritten(tmp_path: Path) -> None:
    import struct
    import zlib

    path = tmp_path / "s.spool"
    legacy = b"".join(struct.pack(">III", len(p), 1, zlib.crc32(p)) + p for p in (b"old-1", b"old-2"))
    path.write_bytes(legacy)
    spool = Spool(path, fsync="never")
    assert (spool.pending_exchanges, spool.skipped_records) == (2, 0)
    assert path.read_bytes().startswith(MAGIC)
    assert _records(spool) == [b"old-1", b"old-2"]
    spool.close()


def test_files_are_private_and_the_directory_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:  # records what was fsynced, and fsyncs it
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    spool = Spool(tmp_path / "dir" / "s.spool")
    assert True in synced  # the new file's name is durable, not only its bytes
    spool.append(b"one", 1)
    spool.append(b"two", 1)
    synced.clear()
    record = spool.peek()
    assert record is not None
    spool.commit(record.end, record.generation)  # the offset file is replaced: the directory again
    assert synced.count(True) >= 1
    for name in ("s.spool", "s.spool.offset", "s.spool.lock"):
        assert stat.S_IMODE((tmp_path / "dir" / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((tmp_path / "dir").stat().st_mode) == 0o700
    spool.close()


_WORKER = """
import sys
from bleedwatch.spool import Spool

path, name, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
spool = Spool(path, fsync="never")
delivered = []
for i in range(count):
    assert spool.append(f"{name}-{i}|".encode() * 50, 1)
    if i % 3 == 0:  # deliver what is at the head, as a client replaying does, racing the other process
        record = spool.peek()
        if record is not None:
            delivered.append(record.payload.split(b"|")[0].decode())
            spool.commit(record.end, record.generation)
spool.close()
open(out, "w").write("\\n".join(delivered))
"""


def test_two_processes_given_one_spool_path_cannot_corrupt_it(tmp_path: Path) -> None:
    path = tmp_path / "shared.spool"
    count = 300
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(path), name, str(count), str(tmp_path / f"{name}.out")],
            cwd=Path(__file__).parent.parent,
        )
        for name in ("a", "b")
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    spool = Spool(path, fsync="never")
    assert spool.skipped_records == 0
    left = [p.decode() for p in _records(spool)]
    assert spool.skipped_records == 0
    spool.close()
    sent = {line for name in ("a", "b") for line in (tmp_path / f"{name}.out").read_text().split("\n") if line}
    names = {f"{name}-{i}" for name in ("a", "b") for i in range(count)}
    assert all(p == f"{p.split('|')[0]}|" * 50 for p in left)  # every record whole
    # Every record either delivered (by one process or both: at least once) or still waiting.
    assert names == sent | {p.split("|")[0] for p in left}


async def test_the_client_counts_a_skipped_spool_record_as_a_drop(tmp_path: Path) -> None:
    path = tmp_path / "bw.spool"
    earlier = Spool(path)
    for prefix in ("a", "b"):
        earlier.append(orjson.dumps({"exchanges": exchanges(1, prefix)}), 1)
    earlier.close()
    data = bytearray(path.read_bytes())
    data[HEADER.size + 10] ^= 0xFF  # the first record's payload
    path.write_bytes(bytes(data))
    sidecar = Sidecar()
    async with sidecar.client(spool=path) as client:
        await eventually(lambda: client.accepted == 1)
        assert client.dropped_by_reason == {"spool_corrupt": 1}
    assert sidecar.seen_ids == {"b-0"}


async def test_the_client_counts_each_of_adjacent_bad_spool_records(tmp_path: Path) -> None:
    path = tmp_path / "bw.spool"
    earlier = Spool(path)
    payloads = [orjson.dumps({"exchanges": exchanges(2, prefix)}) for prefix in ("a", "b", "c", "d", "e")]
    for payload in payloads:
        earlier.append(payload, 2)
    earlier.close()
    _damage_adjacent_records(path, payloads, range(1, 4))
    sidecar = Sidecar()
    async with sidecar.client(spool=path) as client:
        await eventually(lambda: client.accepted == 4)
        # Three records lost; how many exchanges each held is part of what failed its check.
        assert client.dropped_by_reason == {"spool_corrupt": 3}
    assert sidecar.seen_ids == {"a-0", "a-1", "e-0", "e-1"}


@dataclass
class Sidecar:
    """The service as a mock transport: up or down (connection refused), recording what it got."""

    up: bool = True
    batches: list[list[str]] = field(default_factory=list)
    drop_reports: list[dict[str, Any]] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        body = orjson.loads(request.content)
        if request.url.path == "/v1/sdk/drops":
            self.drop_reports.append(body)
            return httpx.Response(202, json={"counted": body["count"]})
        ids = [ex["request_id"] for ex in body["exchanges"]]
        self.batches.append(ids)
        fresh = [i for i in ids if i not in self.seen_ids]
        self.seen_ids.update(ids)
        return httpx.Response(202, json={"accepted": len(fresh), "duplicates": len(ids) - len(fresh), "findings": 0})

    def client(self, **kwargs: Any) -> BleedwatchClient:
        options: dict[str, Any] = {"max_attempts": 2, "max_backoff_seconds": 0.01, "flush_seconds": 0.05}
        return BleedwatchClient("http://bw", "bw_k_s", transport=httpx.MockTransport(self.handle), **(options | kwargs))


def exchanges(n: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [exchange("acme", f"{prefix}-{i}", words("json", 0, 40), words("csv", 0, 40), time.time()) for i in range(n)]


async def eventually(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_close_tries_once_what_the_sender_gave_up_on_not_a_round_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A port nobody listens on. The background sender's round runs out and the batch goes to the
    spool; close then tries the spooled batch once and the one queued since once (into the spool
    too), not a round each."""
    client = BleedwatchClient(
        f"http://127.0.0.1:{free_port()}",
        "bw_k_s",
        batch_size=2,
        max_attempts=3,
        max_backoff_seconds=0.01,
        flush_seconds=3600,
        spool=tmp_path / "bw.spool",
    )
    async with client:
        for ex in exchanges(2):
            await client.submit(ex)  # a full batch: the sender posts it
        await eventually(lambda: client.spooled == 2)
        assert failed_attempts(caplog) == 3
        await client.submit(exchanges(1, "late")[0])
    assert failed_attempts(caplog) == 3 + 1 + 1
    assert (client.spooled, client.dropped) == (3, 0)
    spool = Spool(tmp_path / "bw.spool")
    assert spool.pending_exchanges == 3
    spool.close()


async def test_batches_wait_in_the_spool_while_the_service_is_away(tmp_path: Path) -> None:
    sidecar = Sidecar(up=False)
    client = sidecar.client(batch_size=3, spool=tmp_path / "bw.spool")
    async with client:
        for ex in exchanges(7):
            await client.submit(ex)
        spool = client.spool
        assert spool is not None
        await eventually(lambda: spool.pending_exchanges == 7)
        assert client.dropped == 0
        sidecar.up = True
        await eventually(lambda: not spool and client.accepted == 7)
    assert sorted(sidecar.seen_ids) == sorted(f"r-{i}" for i in range(7))
    assert client.dropped == 0
    assert (tmp_path / "bw.spool").stat().st_size == 0


async def test_a_spool_left_by_an_earlier_process_is_replayed(tmp_path: Path) -> None:
    earlier = Spool(tmp_path / "bw.spool")
    earlier.append(orjson.dumps({"exchanges": exchanges(2, "old")}), 2)
    earlier.close()
    sidecar = Sidecar()
    async with sidecar.client(spool=tmp_path / "bw.spool") as client:
        await eventually(lambda: client.accepted == 2)
    assert sidecar.seen_ids == {"old-0", "old-1"}


async def test_only_what_neither_spool_nor_queue_can_hold_is_dropped_counted_and_reported_once(
    tmp_path: Path,
) -> None:
    sidecar = Sidecar(up=False)
    one_batch = len(orjson.dumps({"exchanges": exchanges(2)})) + HEADER.size
    spool = Spool(tmp_path / "bw.spool", max_bytes=one_batch + 100, fsync="never")
    async with sidecar.client(batch_size=2, max_pending=2, spool=spool) as client:
        for ex in exchanges(6):  # the spool holds one batch of two, the queue two more
            await client.submit(ex)
        await eventually(lambda: client.dropped == 2 and spool.pending_exchanges == 2)
        sidecar.up = True
        await eventually(lambda: client.accepted == 4 and len(sidecar.drop_reports) == 1)
    assert sidecar.drop_reports[0]["count"] == 2
    assert len(sidecar.drop_reports) == 1  # acknowledged: never sent again
    assert client.dropped == 2
    assert len(sidecar.seen_ids) == 4


async def test_closing_while_the_service_is_away_keeps_every_exchange(tmp_path: Path) -> None:
    """Close with many batches queued and the service down: all of them go to the spool (the close
    used to stop at the first batch, and the rest were lost uncounted); without a spool every one is
    counted as dropped and the close says so."""
    sidecar = Sidecar(up=False)
    client = sidecar.client(batch_size=10, flush_seconds=3600, spool=tmp_path / "bw.spool")
    for ex in exchanges(35):
        await client.submit(ex)
    await client.aclose()
    spool = Spool(tmp_path / "bw.spool")
    assert (client.dropped, spool.pending_exchanges) == (0, 35)
    spool.close()

    client = sidecar.client(batch_size=10, flush_seconds=3600)
    for ex in exchanges(35):
        await client.submit(ex)
    with pytest.raises(Undelivered):
        await client.aclose()
    assert client.dropped_by_reason == {"closed_undelivered": 35}


async def test_a_failing_spool_disk_or_a_strange_answer_loses_no_batch(tmp_path: Path) -> None:
    """A spool write that fails (a full disk) keeps the batch in memory; a 202 that is not JSON (a
    proxy's page) and a Retry-After of a non-ASCII digit are failures to retry, not lost batches."""
    sidecar = Sidecar(up=False)
    async with sidecar.client(batch_size=2, spool=tmp_path / "bw.spool") as client:
        spool = client.spool
        assert spool is not None

        def full(payload: bytes, exchanges: int) -> bool:
            raise OSError(28, "No space left on device")

        spool.append = full  # type: ignore[method-assign]
        for ex in exchanges(4):
            await client.submit(ex)
        await eventually(lambda: client.pending == 4)  # tried, failed, held
        assert client.dropped == 0
        sidecar.up = True
        await eventually(lambda: client.accepted == 4)

    answers = iter(
        [
            httpx.Response(202, text="<html>maintenance</html>"),
            httpx.Response(503, headers={b"Retry-After": "\u00b2".encode("latin-1")}),
        ]
    )

    def strange(request: httpx.Request) -> httpx.Response:
        return next(answers, None) or sidecar.handle(request)

    client = BleedwatchClient("http://bw", "bw_k_s", transport=httpx.MockTransport(strange), max_backoff_seconds=0.01)
    for ex in exchanges(2, "s"):
        await client.submit(ex)
    await client.aclose()
    assert (client.accepted, client.dropped) == (2, 0)


async def test_submit_text_returns_before_the_hashing_is_done() -> None:
    sidecar = Sidecar()
    async with sidecar.client(batch_size=100, flush_seconds=60) as client:
        text = " ".join([words("argparse")] * 50)
        start = time.perf_counter()
        for i in range(20):
            await client.submit_text(text, text, key=bytes(32), tenant="acme", request_id=f"t-{i}", model="m")
        handed_over = time.perf_counter() - start
        assert client.pending == 20
        await client.flush()
        assert client.accepted == 20
    assert handed_over >= 0  # measured in bench/sdk_overhead.py; here only that it did not wait for the sends
    assert sum(len(b) for b in sidecar.batches) == 20


async def test_a_very_long_text_is_fingerprinted_in_a_worker_process() -> None:
    sidecar = Sidecar()
    long_prompt = " ".join([words("argparse")] * 200)  # past LONG_TEXT_CHARS
    async with sidecar.client(flush_seconds=60) as client:
        await client.submit_text(long_prompt, "ok", key=bytes(32), tenant="acme", request_id="long", model="m")
        await client.submit_text("short", "ok", key=bytes(32), tenant="acme", request_id="short", model="m")
        await client.flush()
        assert client.accepted == 2
    assert sidecar.seen_ids == {"long", "short"}


async def test_a_dead_fingerprinting_process_is_replaced_and_raw_text_waiting_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker process killed (the OOM killer) while it holds a text: that text is a counted drop,
    never a wait for ever, and the next long text gets a new process; one killed while idle costs
    no text. Raw text waiting to be fingerprinted is bounded in characters, not only in count."""
    sidecar = Sidecar()
    long_prompt = " ".join([words("argparse")] * 200)  # past LONG_TEXT_CHARS
    receive = hashing._receive

    def killed_before_answering(process: subprocess.Popen[bytes]) -> bytes:
        monkeypatch.setattr(hashing, "_receive", receive)  # the first text only
        process.kill()
        return receive(process)

    async with sidecar.client(flush_seconds=60) as client:
        await client.submit_text(long_prompt, "ok", key=bytes(32), tenant="acme", request_id="l-1", model="m")
        await client.flush_hashing()
        processes = client._processes
        assert processes is not None
        assert processes.process is not None
        processes.process.kill()
        processes.process.wait()
        await client.submit_text(long_prompt, "ok", key=bytes(32), tenant="acme", request_id="l-2", model="m")
        await client.flush_hashing()
        monkeypatch.setattr(hashing, "_receive", killed_before_answering)
        await client.submit_text(long_prompt, "ok", key=bytes(32), tenant="acme", request_id="l-3", model="m")
        await client.flush_hashing()
        await client.submit_text(long_prompt, "ok", key=bytes(32), tenant="acme", request_id="l-4", model="m")
        await client.flush()
        assert processes.started == 3
    assert sidecar.seen_ids == {"l-1", "l-2", "l-4"}
    assert client.dropped_by_reason == {"fingerprinting_failed": 1}

    async with sidecar.client(flush_seconds=60, max_hashing_chars=100) as client:
        for i in range(3):  # 80 characters each, handed over at once: the first goes, the others wait for room
            await client.submit_text("x " * 20, "y " * 20, key=bytes(32), tenant="acme", request_id=f"b-{i}", model="m")
        await client.flush()
    assert client.dropped_by_reason == {"fingerprinting_queue_full": 2}


async def test_a_long_text_is_fingerprinted_as_in_process_and_the_process_ends_on_close() -> None:
    """Field for field what ``fingerprint_exchange`` gives in the gateway's own process, whichever way
    the text went (a lone surrogate, non-ASCII, meta, other parameters included); a key the scheme
    refuses is a counted drop that keeps the process; ``aclose`` ends it."""
    prompt = " ".join([words("difflib")] * 300) + " na\u00efve \ud800 \U0001f600 end"  # past LONG_TEXT_CHARS
    response = words("json") + " \udfff"
    params = Params(n=5, w=4, sample_after=1000, sample_mod=3, response_w=2)
    meta: dict[str, Scalar] = {"deployment": "pd-1", "node": None, "prompt_tokens": 12}
    names: dict[str, Any] = {"tenant": "acme", "model": "m", "ts": 1_700_000_000.25, "meta": meta, "params": params}
    client = BleedwatchClient("http://bw", "bw_k_s", flush_seconds=60)
    await client.submit_text(prompt, response, key=KEY, request_id="long", **names)
    await client.submit_text(prompt[:5000], response, key=KEY, request_id="short", **names)
    await client.submit_text(prompt, response, key=bytes(8), request_id="bad-key", **names)
    await client.flush_hashing()
    assert len(prompt) > LONG_TEXT_CHARS
    assert {ex["request_id"]: ex for ex in client._pending} == {
        "long": fingerprint_exchange(prompt, response, key=KEY, request_id="long", **names),
        "short": fingerprint_exchange(prompt[:5000], response, key=KEY, request_id="short", **names),
    }
    assert client.dropped_by_reason == {"fingerprinting_failed": 1}
    processes = client._processes
    assert processes is not None
    process = processes.process
    assert process is not None
    assert processes.started == 1
    client._pending.clear()
    await client.aclose()
    assert processes._thread is not None
    await asyncio.to_thread(processes._thread.join)
    assert process.returncode == 0


GATEWAY_WITHOUT_GUARD = """
import asyncio, json, os, sys
import httpx
from bleedwatch.client import BleedwatchClient

with open(sys.argv[1], "a") as runs:  # a gateway that starts its server here, with no __main__ guard
    runs.write(f"{os.getpid()}\\n")

async def main():
    answer = httpx.Response(202, json={"accepted": 1, "duplicates": 0, "findings": 0})
    client = BleedwatchClient("http://bw", "bw_k_s", transport=httpx.MockTransport(lambda request: answer))
    await client.submit_text("word " * 60_000, "ok", key=bytes(32), tenant="acme", request_id="long", model="m")
    await client.aclose()
    print(json.dumps({"accepted": client.accepted, "dropped": client.dropped_by_reason}))

asyncio.run(main())
"""


def test_a_gateway_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """multiprocessing's spawn imported the gateway's ``__main__`` again in the fingerprinting process:
    a script without ``if __name__ == "__main__":`` ran its body there too, the pool broke, and every
    long text was dropped. The fingerprinting process imports bleedwatch alone."""
    script, runs = tmp_path / "gateway.py", tmp_path / "runs"
    script.write_text(GATEWAY_WITHOUT_GUARD)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(SDK), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(script), str(runs)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {"accepted": 1, "dropped": {}}
    assert len(runs.read_text().split()) == 1, done.stderr


@pytest.mark.parametrize("settings", ["embedded", "redis+postgres"], indirect=True)
async def test_drop_reports_feed_the_metric_once_each(api: Api) -> None:
    before = metrics.SDK_DROPPED._value.get()
    headers = api.headers(Role.INGEST)
    report = {"report_id": "0123456789abcdef", "count": 7}
    first = await api.client.post("/v1/sdk/drops", json=report, headers=headers)
    assert (first.status_code, first.json()) == (202, {"counted": 7})
    again = await api.client.post("/v1/sdk/drops", json=report, headers=headers)  # the SDK retried
    assert (again.status_code, again.json()) == (202, {"counted": 0})
    assert metrics.SDK_DROPPED._value.get() - before == 7
    bad = await api.client.post("/v1/sdk/drops", json={"report_id": "x", "count": 0}, headers=headers)
    assert bad.status_code == 422
    assert (await api.client.post("/v1/sdk/drops", json=report, headers=api.headers(Role.READ))).status_code == 403
