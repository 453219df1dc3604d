"""The client's fingerprinting process (``python -m bleedwatch.worker``): the thread that feeds it.

Very long texts are hashed in a process of their own rather than in a thread of the gateway:
tokenising a megabyte-sized prompt is one long C call that would hold the GIL, and so the
gateway's event loop. The process is started with subprocess, not multiprocessing: spawn and
forkserver import the gateway's ``__main__`` again in the child, so a gateway script that starts
its server at module level (no ``if __name__ == "__main__":``) ran a second time there and broke
the pool, and fork would copy a threaded process. This child imports bleedwatch and nothing else
of the gateway's, and of bleedwatch only what fingerprinting needs: its loop is in worker.py, not
here, so that it loads neither this module's threads and pipes nor the client (the package's
``__init__`` loads the client on first use only).

Frames, both ways, over the child's stdin and stdout: 8 bytes of length (little-endian), then the
bytes. A request is three frames: JSON ``{"key": hex, "params": [n, w, ...]}``, the prompt and the
response in UTF-8 (``surrogatepass``: a lone surrogate, which the scheme reads as a space, travels
as it is). An answer is one JSON frame: ``{"texts": [prompt, response]}`` from
``fingerprint_texts``, or ``{"error": the exception's type name}``, never its message, which could
quote the text.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from bleedwatch.exchange import Texts
from bleedwatch.fingerprint.scheme import Params
from bleedwatch.worker import LENGTH as _LENGTH

log = logging.getLogger("bleedwatch.sdk")

_CHUNK = 1 << 20
_CHECK_SECONDS = 0.5  # how often a wait on the pipes checks that the process still lives
_EXIT_SECONDS = 5.0  # a process told to stop (its stdin closed) gets this long before it is killed


class WorkerDied(Exception):
    """The fingerprinting process exited (the OOM killer, a kill) before it answered."""


class FingerprintingError(Exception):
    """The fingerprinting process could not fingerprint the text (a bad key): the exception's name only."""


@dataclasses.dataclass(slots=True)
class _Job:
    future: concurrent.futures.Future[Any]
    prompt: str
    response: str
    key: bytes
    params: Params
    finish: Callable[[Texts], Any]


class FingerprintProcess:
    """One fingerprinting process and one thread that feeds it, a text at a time.

    ``submit`` returns a future at once. The thread starts the process on the first text, and a new
    one on the text after a process died; the text a dead process held fails with ``WorkerDied``
    (never a wait for ever: while the thread waits on the pipes it checks the process every
    ``_CHECK_SECONDS``), the texts behind it go to the new one.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.process: subprocess.Popen[bytes] | None = None  # the one running now, if any
        self.started = 0  # processes started, the first included

    def submit(
        self, prompt: str, response: str, key: bytes, params: Params, finish: Callable[[Texts], Any]
    ) -> concurrent.futures.Future[Any]:
        """A future of ``finish(fingerprint_texts(prompt, response, key, params))``; ``finish`` runs in
        the feeding thread, not on the caller's event loop."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot fingerprint after close")
            if self._thread is None:
                self._thread = threading.Thread(target=self._feed, name="bleedwatch-fp-process", daemon=True)
                self._thread.start()
            self._jobs.put(_Job(future, prompt, response, key, params, finish))
        return future

    def close(self) -> None:
        """Cancel the texts waiting; the process ends after the text it holds (its stdin closes).
        Returns at once: the thread does the waiting."""
        with self._lock:
            self._closed = True
            self._jobs.put(None)

    def _feed(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._closed:
                job.future.cancel()
                continue
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                result = job.finish(self._ask(job))
            except Exception as exc:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
            del job
        self._stop()

    def _ask(self, job: _Job) -> Texts:
        if self.process is not None and self.process.poll() is not None:  # died idle: no text lost
            self._reap(self.process)
        process = self.process or self._start()
        try:
            for frame in _frames(job):
                _send(process, _LENGTH.pack(len(frame)))
                _send(process, frame)
            answer = orjson.loads(_receive(process))
        except Exception as exc:  # dead, or talking nonsense: either way a new one for the next text
            self._reap(process)
            raise WorkerDied(f"the fingerprinting process exited (code {process.returncode})") from exc
        if "error" in answer:
            raise FingerprintingError(answer["error"])
        prompt, response = answer["texts"]
        return prompt, response

    def _start(self) -> subprocess.Popen[bytes]:
        """``-P`` keeps the working directory off its path; the gateway's own path goes through
        PYTHONPATH, so the child imports the same bleedwatch, wherever it was found."""
        path = os.pathsep.join(p for p in sys.path if p)
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "bleedwatch.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        assert process.stdin is not None
        assert process.stdout is not None
        os.set_blocking(process.stdin.fileno(), False)
        os.set_blocking(process.stdout.fileno(), False)
        self.process = process
        self.started += 1
        return process

    def _reap(self, process: subprocess.Popen[bytes]) -> None:
        self.process = None
        with contextlib.suppress(OSError):
            process.kill()
        process.wait()
        _close_pipes(process)
        log.error(
            "bleedwatch: the fingerprinting process exited (code %s); the next long text starts another",
            process.returncode,
        )

    def _stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        _close_pipes(process)  # its stdin at end of file: it exits
        try:
            process.wait(_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _frames(job: _Job) -> Iterator[bytes]:
    """A request's frames, one at a time: the UTF-8 copy of only one text is held at once."""
    yield orjson.dumps({"key": job.key.hex(), "params": dataclasses.astuple(job.params)})
    yield job.prompt.encode("utf-8", "surrogatepass")
    yield job.response.encode("utf-8", "surrogatepass")


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _wait(process: subprocess.Popen[bytes], fd: int, event: int) -> None:
    """Until ``fd`` is ready, or the process is gone: a dead child's pipe may stay open in a process
    the gateway forked meanwhile, so end of file alone cannot be relied on."""
    poller = select.poll()
    poller.register(fd, event)
    while not poller.poll(_CHECK_SECONDS * 1000):
        if process.poll() is not None:
            raise WorkerDied


def _send(process: subprocess.Popen[bytes], data: bytes) -> None:
    assert process.stdin is not None
    fd, view = process.stdin.fileno(), memoryview(data)
    while view:
        _wait(process, fd, select.POLLOUT)
        with contextlib.suppress(BlockingIOError):
            view = view[os.write(fd, view[:_CHUNK]) :]


def _receive(process: subprocess.Popen[bytes]) -> bytes:
    (length,) = _LENGTH.unpack(_read(process, _LENGTH.size))
    return _read(process, length)


def _read(process: subprocess.Popen[bytes], length: int) -> bytes:
    assert process.stdout is not None
    fd, data = process.stdout.fileno(), bytearray()
    while len(data) < length:
        _wait(process, fd, select.POLLIN)
        try:
            chunk = os.read(fd, min(length - len(data), _CHUNK))
        except BlockingIOError:
            continue
        if not chunk:
            raise WorkerDied
        data += chunk
    return bytes(data)
