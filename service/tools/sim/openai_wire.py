"""The slice of the OpenAI chat-completions wire format the simulator's front and gateway speak."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

STREAM_CHUNK_WORDS = 8


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatRequest(BaseModel):
    """What the front reads; anything else a client sends (temperature, ...) is accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def message_text(message: Message) -> str:
    if isinstance(message.content, str):
        return message.content
    if message.content is None:
        return ""
    return "\n".join(p.text for p in message.content if p.type == "text" and p.text)


def prompt_text(messages: list[Message]) -> str:
    """The prompt as the engine reads it and the gateway fingerprints it: contents, in order."""
    return "\n\n".join(t for t in (message_text(m) for m in messages) if t)


def error_body(message: str, code: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


FinishReason = Literal["stop", "length"]


def completion(
    request_id: str, model: str, content: str, finish: FinishReason, use: dict[str, int], created: int | None = None
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": use,
    }


def _chunk(request_id: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    } | extra
    return b"data: " + orjson.dumps(body) + b"\n\n"


def stream_chunks(
    request_id: str, model: str, content: str, finish: FinishReason, use: dict[str, int] | None
) -> Iterator[bytes]:
    """Server-sent events: a role delta, the content a few words at a time, the finish, [DONE]."""
    created = int(time.time())
    yield _chunk(request_id, model, created, [{"index": 0, "delta": {"role": "assistant", "content": ""}}])
    words = content.split(" ") if content else []
    for i in range(0, len(words), STREAM_CHUNK_WORDS):
        piece = (" " if i else "") + " ".join(words[i : i + STREAM_CHUNK_WORDS])
        yield _chunk(request_id, model, created, [{"index": 0, "delta": {"content": piece}}])
    yield _chunk(request_id, model, created, [{"index": 0, "delta": {}, "finish_reason": finish}])
    if use is not None:
        yield _chunk(request_id, model, created, [], usage=use)
    yield b"data: [DONE]\n\n"


class StreamReader:
    """Reassembles a streamed completion from SSE lines: id, model, content, usage."""

    def __init__(self) -> None:
        self.request_id: str | None = None
        self.model: str | None = None
        self.parts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.done = False

    @property
    def content(self) -> str:
        return "".join(self.parts)

    def feed(self, line: str) -> dict[str, Any] | None:
        """One line of the stream; returns the chunk it carried, if any."""
        if not line.startswith("data:"):
            return None
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict):
            return None
        self.request_id = self.request_id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if isinstance(piece, str):
                self.parts.append(piece)
        return chunk
