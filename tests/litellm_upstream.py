"""A fake model provider on loopback for the real-LiteLLM test: OpenAI chat completions,
completions and Responses API, and Anthropic messages, each plain or streamed (SSE).

Standard library only: it runs inside the LiteLLM venv (tests/test_sdk_litellm_real.py), where
bleedwatch's server packages are absent. A user text ``recite:<name>`` is answered with
``RECITALS[name]`` (how a test plants a leaked answer); any other with its words reversed.
Streams are cut at word boundaries, so LiteLLM has to assemble the answer from many chunks.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECITALS: dict[str, str] = {}


def _user_text(body: dict[str, Any]) -> str:
    if isinstance(body.get("prompt"), str):
        text: str = body["prompt"]
    elif isinstance(body.get("input"), str):
        text = body["input"]
    else:
        items = body.get("messages") or body.get("input") or []
        content = items[-1].get("content", "") if items else ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text = str(content)
    return text


def answer_for(body: dict[str, Any]) -> str:
    text = _user_text(body)
    for word in text.split():
        if word.startswith("recite:") and word[len("recite:") :] in RECITALS:
            return RECITALS[word[len("recite:") :]]
    return " ".join(reversed(text.split()))


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        answer = answer_for(body)
        model = str(body.get("model", "fake"))
        path = self.path.split("?")[0]
        stream = bool(body.get("stream"))
        if path.endswith("/chat/completions"):
            events = _chat(model, answer, stream)
        elif path.endswith("/completions"):
            events = _completions(model, answer, stream)
        elif path.endswith("/responses"):
            events = _responses(model, answer, stream)
        elif path.endswith("/messages"):
            events = _anthropic(model, answer, stream)
        else:
            self.send_error(404)
            return
        if not stream:
            payload = json.dumps(next(iter(events))[1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        chunks = []
        for event, data in events:
            head = f"event: {event}\n" if event else ""
            chunks.append(f"{head}data: {json.dumps(data) if not isinstance(data, str) else data}\n\n".encode())
        payload = b"".join(chunks)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


Event = tuple[str | None, Any]
USAGE = {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050}


def _chat(model: str, answer: str, stream: bool) -> Iterator[Event]:
    rid, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if not stream:
        message = {"role": "assistant", "content": answer}
        yield (
            None,
            {
                "id": rid,
                "object": "chat.completion",
                "created": now,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": USAGE,
            },
        )
        return
    base = {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model}
    yield None, base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    for piece in _pieces(answer):
        yield None, base | {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
    yield None, base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": USAGE}
    yield None, "[DONE]"


def _completions(model: str, answer: str, stream: bool) -> Iterator[Event]:
    rid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    base = {"id": rid, "object": "text_completion", "created": now, "model": model}
    if not stream:
        yield None, base | {"choices": [{"index": 0, "text": answer, "finish_reason": "stop"}], "usage": USAGE}
        return
    for piece in _pieces(answer):
        yield None, base | {"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
    yield None, base | {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": USAGE}
    yield None, "[DONE]"


def _responses(model: str, answer: str, stream: bool) -> Iterator[Event]:
    rid, mid, now = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time())
    message = {
        "id": mid,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": answer, "annotations": []}],
    }
    usage = {"input_tokens": 1000, "output_tokens": 50, "total_tokens": 1050}
    done = {
        "id": rid,
        "object": "response",
        "created_at": now,
        "status": "completed",
        "model": model,
        "output": [message],
        "usage": usage,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if not stream:
        yield None, done
        return
    started = done | {"status": "in_progress", "output": [], "usage": None}
    yield "response.created", {"type": "response.created", "sequence_number": 0, "response": started}
    item = message | {"status": "in_progress", "content": []}
    yield "response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}
    for n, piece in enumerate(_pieces(answer)):
        yield (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
                "sequence_number": n + 2,
            },
        )
    yield "response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": message}
    yield "response.completed", {"type": "response.completed", "sequence_number": 999, "response": done}


def _anthropic(model: str, answer: str, stream: bool) -> Iterator[Event]:
    mid = f"msg_{uuid.uuid4().hex}"
    usage = {"input_tokens": 1000, "output_tokens": 50}
    if not stream:
        yield (
            None,
            {
                "id": mid,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": answer}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": usage,
            },
        )
        return
    start: dict[str, Any] = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1000, "output_tokens": 1},
    }
    yield "message_start", {"type": "message_start", "message": start}
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    yield "content_block_start", block
    for piece in _pieces(answer):
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
        yield "content_block_delta", delta
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    end = {"stop_reason": "end_turn", "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": end, "usage": {"output_tokens": 50}}
    yield "message_stop", {"type": "message_stop"}


def start() -> tuple[str, ThreadingHTTPServer]:
    """Serve on a free loopback port in a daemon thread; returns the base URL and the server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, name="fake-upstream", daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
