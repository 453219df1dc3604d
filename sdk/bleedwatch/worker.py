"""``python -m bleedwatch.worker``: the client's fingerprinting process (sdk/bleedwatch/hashing.py says why
a process, and why not one of multiprocessing's, and what its frames hold).

The child's side only, apart from hashing.py's feeding thread, so that the process imports what
fingerprinting needs (numpy, orjson, the scheme) and not the client, httpx, asyncio, threads or
subprocess: tests/test_sdk_imports.py holds it to that. hashing.py imports ``LENGTH`` from here in
the gateway; in the child this module runs as ``__main__`` and nothing imports it a second time.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from typing import IO, Any

import orjson

from bleedwatch.exchange import fingerprint_texts
from bleedwatch.fingerprint.scheme import Params

LENGTH = struct.Struct("<Q")  # a frame's length, before its bytes


def main() -> None:
    """Ctrl-C in the gateway's terminal is the gateway's to handle: this process ends when its stdin
    does. Anything printed goes to stderr, never into a frame."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer requests until end of file."""
    while (header := _frame(requests)) is not None:
        prompt, response = _frame(requests), _frame(requests)
        if prompt is None or response is None:
            return
        answer = _answer(orjson.loads(header), prompt, response)
        del prompt, response
        payload = orjson.dumps(answer)
        answers.write(LENGTH.pack(len(payload)))
        answers.write(payload)
        answers.flush()


def _frame(stream: IO[bytes]) -> bytes | None:
    header = stream.read(LENGTH.size)
    if len(header) < LENGTH.size:
        return None  # the client closed, or its process is gone
    (length,) = LENGTH.unpack(header)
    payload = stream.read(length)
    return payload if len(payload) == length else None


def _answer(header: dict[str, Any], prompt: bytes, response: bytes) -> dict[str, Any]:
    try:
        key, params = bytes.fromhex(header["key"]), Params(*header["params"])
        texts = fingerprint_texts(
            prompt.decode("utf-8", "surrogatepass"), response.decode("utf-8", "surrogatepass"), key, params
        )
    except Exception as exc:
        return {"error": type(exc).__name__}
    return {"texts": texts}


if __name__ == "__main__":
    main()
