"""``python -m bleedwatch.worker``: the client's fingerprinting process (sdk/bleedwatch/hashing.py says why
a process, and why not one of multiprocessing's). Imported by nothing: run, never loaded twice."""

from __future__ import annotations

import os
import signal
import sys

from bleedwatch.hashing import serve


def main() -> None:
    """Ctrl-C in the gateway's terminal is the gateway's to handle: this process ends when its stdin
    does. Anything printed goes to stderr, never into a frame."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
