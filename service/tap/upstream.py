"""The tap's side towards the engine: a small HTTP/1.1 client that hands bytes on as they arrive.

Not httpx: with hundreds of streams in flight its pool and h11 cost the tap more CPU than all
else (docs/performance.md, "The tap"). The tap needs only one origin, kept-alive connections,
and each body piece handed on the moment it is read.

``HttpxUpstream`` gives the same interface over an httpx transport, for tests that run the
engine in the test's own event loop (``httpx.ASGITransport``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

_CHUNK = 64 * 1024
_NO_BODY_STATUS = frozenset({204, 304})


class UpstreamError(Exception):
    """The engine could not be reached, or broke the HTTP exchange off; ``str`` names the kind only."""


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: list[tuple[bytes, bytes]]  # names lower case, as received otherwise
    body: AsyncGenerator[bytes, None]
    close: Callable[[], Awaitable[None]]

    def header(self, name: bytes) -> str | None:
        return next((v.decode("latin-1") for k, v in self.headers if k == name), None)


class Upstream(Protocol):
    async def request(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


class _Conn:
    """One connection to the engine, and when its next read is due (the watchdog's business)."""

    __slots__ = ("deadline", "reader", "timed_out", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.deadline = float("inf")
        self.timed_out = False


_ERRORS = (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


class Http11Upstream:
    """Kept-alive HTTP/1.1 connections to one origin (``http://`` or ``https://``, with an optional path prefix).

    Read timeouts are a per-connection deadline checked by one watchdog task, not a timer per
    read, which cost more CPU than the reading (docs/performance.md).
    """

    def __init__(self, url: str, *, connect_seconds: float, read_seconds: float, max_idle: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the upstream URL must be http:// or https:// with a host")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/").encode()
        self._host_header = parts.netloc.rsplit("@", 1)[-1].encode()
        self._connect_seconds = connect_seconds
        self._read_seconds = read_seconds
        self._max_idle = max_idle
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.writer.close()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, self._read_seconds / 4))
            now = loop.time()
            for conn in [c for c in self._busy if c.deadline < now]:
                conn.timed_out = True
                conn.writer.transport.abort()  # the read waiting on it ends at once, as an error

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self._host, self._port, ssl=self._ssl, limit=1024 * 1024), self._connect_seconds
        )
        return _Conn(reader, writer)

    async def request(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="bleedwatch-tap-watchdog")
        head = [b"%s %s%s HTTP/1.1\r\nhost: %s\r\n" % (method.encode(), self._prefix, target, self._host_header)]
        head += [b"%s: %s\r\n" % (k, v) for k, v in headers]
        if body or method not in ("GET", "HEAD"):
            head.append(b"content-length: %d\r\n" % len(body))
        message = b"".join(head) + b"\r\n" + body
        while self._idle:  # a kept-alive connection the engine closed meanwhile fails at once: try the next
            conn = self._idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                conn.writer.close()
                continue
            try:
                return await self._exchange(conn, method, message)
            except _Stale:
                conn.writer.close()
        try:
            conn = await self._connect()
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(type(exc).__name__) from None
        try:
            return await self._exchange(conn, method, message)
        except _Stale:
            conn.writer.close()
            raise UpstreamError("connection closed before an answer") from None

    async def _exchange(self, conn: _Conn, method: str, message: bytes) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        reader, read_seconds = conn.reader, self._read_seconds
        self._busy.add(conn)
        try:
            conn.writer.write(message)
            while True:
                conn.deadline = loop.time() + read_seconds
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if not exc.partial and not conn.timed_out:
                        raise _Stale from None
                    raise
                status, headers, keep_alive = _parse_head(head)
                if not 100 <= status < 200:  # interim answers (100 Continue, 103 Early Hints) are skipped
                    break
        except _Stale:
            self._busy.discard(conn)
            raise
        except _ERRORS as exc:
            self._busy.discard(conn)
            conn.writer.close()
            raise UpstreamError("TimeoutError" if conn.timed_out else type(exc).__name__) from None
        names = dict(headers)
        frames: AsyncGenerator[bytes, None]
        if method == "HEAD" or status in _NO_BODY_STATUS:
            frames = _empty()
        elif b"chunked" in names.get(b"transfer-encoding", b"").lower():
            frames = _chunked(conn, loop, read_seconds)
        elif b"content-length" in names:
            frames = _sized(conn, loop, read_seconds, int(names[b"content-length"]))
        else:
            frames, keep_alive = _until_close(conn, loop, read_seconds), False
        done = False

        async def body() -> AsyncGenerator[bytes, None]:
            nonlocal done
            try:
                async for piece in frames:
                    yield piece
            except _ERRORS as exc:
                raise UpstreamError("TimeoutError" if conn.timed_out else type(exc).__name__) from None
            done = True

        async def close() -> None:
            self._busy.discard(conn)
            await frames.aclose()
            if done and keep_alive and len(self._idle) < self._max_idle and not conn.writer.is_closing():
                conn.deadline = float("inf")
                self._idle.append(conn)
            else:  # not read to its end, or not reusable: the connection goes with it
                conn.writer.close()

        return UpstreamResponse(status, headers, body(), close)


async def _chunked(conn: _Conn, loop: asyncio.AbstractEventLoop, read_seconds: float) -> AsyncGenerator[bytes, None]:
    reader = conn.reader
    while True:
        conn.deadline = loop.time() + read_seconds
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, dropped
                pass
            return
        piece = await reader.readexactly(size + 2)
        yield piece[:-2]


async def _sized(
    conn: _Conn, loop: asyncio.AbstractEventLoop, read_seconds: float, length: int
) -> AsyncGenerator[bytes, None]:
    while length > 0:
        conn.deadline = loop.time() + read_seconds
        piece = await conn.reader.read(min(length, _CHUNK))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)
        yield piece


async def _until_close(
    conn: _Conn, loop: asyncio.AbstractEventLoop, read_seconds: float
) -> AsyncGenerator[bytes, None]:
    while True:
        conn.deadline = loop.time() + read_seconds
        piece = await conn.reader.read(_CHUNK)
        if not piece:
            return
        yield piece


class _Stale(Exception):
    """A kept-alive connection closed by the engine before it answered: the request was not read."""


async def _empty() -> AsyncGenerator[bytes, None]:
    return
    yield b""  # an async generator that yields nothing


def _parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]], bool]:
    """Status, headers (names lower case) and whether the connection may be reused."""
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    status = int(rest[:3])
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError("malformed header line")
        headers.append((name.strip().lower(), value.strip()))
    connection = b",".join(v for k, v in headers if k == b"connection").lower()
    keep_alive = b"close" not in connection if version == b"HTTP/1.1" else b"keep-alive" in connection
    return status, headers, keep_alive


class HttpxUpstream:
    """The same interface over an httpx transport (tests: an engine app in the test's event loop)."""

    def __init__(self, url: str, transport: httpx.AsyncBaseTransport) -> None:
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), transport=transport, timeout=60)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        request = self._http.build_request(method, target.decode("latin-1"), headers=headers, content=body)
        try:
            resp = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamError(type(exc).__name__) from None

        async def body_() -> AsyncGenerator[bytes, None]:
            try:
                async for piece in resp.aiter_raw():
                    yield piece
            except httpx.HTTPError as exc:
                raise UpstreamError(type(exc).__name__) from None

        headers_ = [(k.lower(), v) for k, v in resp.headers.raw]
        return UpstreamResponse(resp.status_code, headers_, body_(), resp.aclose)
