"""An inference engine for the tap's tests: the four APIs' wire formats, answers the test chooses.

Deterministic to the byte (fixed ids and timestamps), so an answer fetched directly and the same
one through the tap can be compared byte for byte. Streams are cut in awkward places on purpose:
a chunk boundary inside a line, CRLF line ends, comment lines, as real engines and the
networks between them produce.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

MODEL = "fake-model"


def _sse(data: dict[str, Any] | str, event: str | None = None, crlf: bool = False) -> bytes:
    body = data if isinstance(data, str) else orjson.dumps(data).decode()
    lines = ([f"event: {event}"] if event else []) + [f"data: {body}"]
    end = "\r\n" if crlf else "\n"
    return (end.join(lines) + end + end).encode()


def _words(text: str, size: int = 3) -> list[str]:
    words = text.split(" ")
    return [(" " if i else "") + " ".join(words[i : i + size]) for i in range(0, len(words), size)]


@dataclass
class FakeEngine:
    """ASGI. ``answer`` is what every next answer says; ``calls`` counts the requests that reached it.

    ``stall_after``: a stream sends that many events, then waits for the client to leave, as a
    slow engine mid-answer would; ``aborted`` counts the streams their client left that way.
    """

    answer: str = "nothing to say"
    prompt_tokens: int = 42
    calls: int = 0
    stall_after: int | None = None
    break_off: bool = False  # instead of stalling, drop the connection mid-answer (as a crashing engine)
    aborted: int = 0
    left: threading.Event = field(default_factory=threading.Event)  # set with each abort, for other threads
    bodies: list[bytes] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def restart_ids(self) -> None:
        """The next answer's id is ``<api>-0`` again: an answer asked for twice is the same bytes."""
        self._ids = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.calls += 1
        self.bodies.append(body)
        path = scope["path"]
        if scope["method"] == "GET" and path == "/v1/models":
            await self._whole(send, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            return
        if path not in _HANDLERS:
            await self._whole(send, {"error": {"message": "not found"}}, 404)
            return
        request = orjson.loads(body)
        rid = f"{path.rsplit('/', 1)[-1]}-{next(self._ids)}"
        chunks = self.events(path, rid, bool(request.get("stream")))
        if not request.get("stream"):
            await self._whole(send, orjson.loads(b"".join(chunks)))
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"x-request-id", rid.encode())],
            }
        )
        if self.stall_after is not None:
            head = b"".join(chunks[: self.stall_after])
            await send({"type": "http.response.body", "body": head, "more_body": True})
            if self.break_off:
                raise ConnectionAbortedError("the fake engine breaks off")
            while (await receive())["type"] != "http.disconnect":
                pass
            self.aborted += 1
            self.left.set()
            return
        raw = b"".join(chunks)
        # Cut at fixed odd offsets: inside lines and events, never where the events end.
        for piece in (raw[i : i + 37] for i in range(0, len(raw), 37)):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def events(self, path: str, rid: str, stream: bool = True) -> list[bytes]:
        """The answer at ``path`` with id ``rid``: one event (or comment) per element when streamed."""
        return getattr(self, _HANDLERS[path])(rid, stream)  # type: ignore[no-any-return]

    async def _whole(self, send: Send, data: dict[str, Any], status: int = 200) -> None:
        body = orjson.dumps(data)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": 7, "total_tokens": self.prompt_tokens + 7}

    def _chat(self, rid: str, stream: bool) -> list[bytes]:
        base = {"id": rid, "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}
        if not stream:
            message = {"role": "assistant", "content": self.answer}
            return [
                orjson.dumps(
                    base
                    | {
                        "object": "chat.completion",
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                        "usage": self._usage(),
                    }
                )
            ]
        out = [_sse(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
        out.append(b": keep-alive\n\n")
        out += [_sse(base | {"choices": [{"index": 0, "delta": {"content": w}}]}) for w in _words(self.answer)]
        out.append(_sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        out.append(_sse(base | {"choices": [], "usage": self._usage()}))
        return [*out, _sse("[DONE]")]

    def _completions(self, rid: str, stream: bool) -> list[bytes]:
        base = {"id": rid, "object": "text_completion", "created": 1700000000, "model": MODEL}
        if not stream:
            choice = {"index": 0, "text": self.answer, "finish_reason": "stop", "logprobs": None}
            return [orjson.dumps(base | {"choices": [choice], "usage": self._usage()})]
        out = [
            _sse(base | {"choices": [{"index": 0, "text": w, "finish_reason": None}]}, crlf=True)
            for w in _words(self.answer)
        ]
        out.append(_sse(base | {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}, crlf=True))
        out.append(_sse(base | {"choices": [], "usage": self._usage()}, crlf=True))
        return [*out, _sse("[DONE]", crlf=True)]

    def _responses(self, rid: str, stream: bool) -> list[bytes]:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": 7, "total_tokens": self.prompt_tokens + 7}
        text = {"type": "output_text", "text": self.answer, "annotations": []}
        done = {
            "id": rid,
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": MODEL,
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [text]},
            ],
            "usage": usage,
        }
        if not stream:
            return [orjson.dumps(done)]
        started = done | {"status": "in_progress", "output": [], "usage": None}
        out = [
            _sse({"type": "response.created", "sequence_number": 0, "response": started}, "response.created"),
        ]
        for i, w in enumerate(_words(self.answer)):
            delta = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "delta": w}
            out.append(_sse(delta | {"content_index": 0, "sequence_number": i + 1}, "response.output_text.delta"))
        out.append(_sse({"type": "response.output_text.done", "text": self.answer}, "response.output_text.done"))
        return [*out, _sse({"type": "response.completed", "response": done}, "response.completed")]

    def _messages(self, rid: str, stream: bool) -> list[bytes]:
        usage = {"input_tokens": self.prompt_tokens - 2, "cache_read_input_tokens": 2, "output_tokens": 7}
        if not stream:
            message = {
                "id": rid,
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [{"type": "text", "text": self.answer}],
                "stop_reason": "end_turn",
                "usage": usage,
            }
            return [orjson.dumps(message)]
        start = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "usage": usage | {"output_tokens": 1},
        }
        out = [
            _sse({"type": "message_start", "message": start}, "message_start"),
            _sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            ),
            _sse({"type": "ping"}, "ping"),
        ]
        for w in _words(self.answer):
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
            out.append(_sse(delta, "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        out.append(
            _sse(
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
                "message_delta",
            )
        )
        return [*out, _sse({"type": "message_stop"}, "message_stop")]

    def _embeddings(self, rid: str, stream: bool) -> list[bytes]:
        return [orjson.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}]})]


_HANDLERS = {
    "/v1/chat/completions": "_chat",
    "/v1/completions": "_completions",
    "/v1/responses": "_responses",
    "/v1/messages": "_messages",
    "/v1/embeddings": "_embeddings",
}


def request(api_path: str, prompt: str, *, stream: bool, system: str | None = None) -> dict[str, Any]:
    """A request body of the API at ``api_path`` carrying ``prompt``."""
    if api_path == "/v1/chat/completions":
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": [{"type": "text", "text": prompt}]}
        ]
        return {"model": MODEL, "messages": messages, "stream": stream}
    if api_path == "/v1/completions":
        return {"model": MODEL, "prompt": prompt, "stream": stream}
    if api_path == "/v1/responses":
        given = [{"role": "user", "content": [{"type": "input_text", "text": prompt}]}]
        return {"model": MODEL, "input": given, "stream": stream} | ({"instructions": system} if system else {})
    return {
        "model": MODEL,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
    } | ({"system": system} if system else {})


async def collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in chunks])
