"""The four inference APIs the tap covers: where each keeps the prompt and the answer.

The tap relays bytes and never parses them on the request path; once an answer has been
relayed, ``read_exchange`` turns the request body and the relayed response bytes (JSON, or
server-sent events when streamed) into the texts to fingerprint. It reads only what the
engine wrote, as written: a field it does not know is ignored, a malformed body or event
gives nothing (``None``), never an exception into the tap.

Prompt text is the message contents in order, joined by a blank line (as the simulator's
engine and the LiteLLM callback join them): the fingerprints only need the same words in the
same order wherever the same text is seen, not the exact layout.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson


class Api(enum.Enum):
    CHAT = "chat.completions"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    MESSAGES = "messages"


# Exact request paths the tap fingerprints (POST only).
PATHS: dict[str, Api] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/responses": Api.RESPONSES,
    "/v1/messages": Api.MESSAGES,
}


@dataclass(slots=True)
class Exchange:
    """What one relayed answer says, text included: it never leaves the tap's process."""

    prompt: str
    response: str
    request_id: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None


@dataclass(slots=True)
class _Answer:
    parts: list[str] = field(default_factory=list)
    request_id: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None

    def meta(self, obj: Mapping[str, Any]) -> None:
        """Id, model and prompt tokens, from whichever object carries them first."""
        if self.request_id is None and isinstance(obj.get("id"), str):
            self.request_id = obj["id"]
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        use = obj.get("usage")
        if isinstance(use, Mapping):
            tokens = _prompt_tokens(use)
            if tokens is not None:
                self.prompt_tokens = tokens


def _prompt_tokens(use: Mapping[str, Any]) -> int | None:
    """OpenAI's ``prompt_tokens``; Responses' ``input_tokens``; Anthropic's input plus its cached parts."""
    if isinstance(use.get("prompt_tokens"), int):
        return int(use["prompt_tokens"])
    total = 0
    for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = use.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
    return total or None


def _text(content: Any) -> str:
    """A content value: a string, or a list of parts of which the text ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, Mapping)
            and p.get("type") in ("text", "input_text", "output_text")
            and isinstance(p.get("text"), str)
        )
    return ""


def _join(texts: Iterable[str]) -> str:
    return "\n\n".join(t for t in texts if t)


def _messages(messages: Any) -> Iterator[str]:
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        for m in messages:
            if isinstance(m, Mapping):
                yield _text(m.get("content"))


def prompt_text(api: Api, body: Mapping[str, Any]) -> str:
    """The prompt in a request body of ``api``."""
    if api is Api.CHAT:
        return _join(_messages(body.get("messages")))
    if api is Api.COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list):  # a batch of prompts, or token ids (nothing to read there)
            return _join(p for p in prompt if isinstance(p, str))
        return prompt if isinstance(prompt, str) else ""
    if api is Api.RESPONSES:
        given = body.get("input")
        inputs = [given] if isinstance(given, str) else list(_messages(given))
        instructions = body.get("instructions")
        return _join([instructions if isinstance(instructions, str) else "", *inputs])
    return _join([_text(body.get("system")), *_messages(body.get("messages"))])


def _whole(api: Api, data: Mapping[str, Any], answer: _Answer) -> None:
    """A non-streamed answer of ``api``."""
    answer.meta(data)
    if api is Api.CHAT:
        for choice in _list(data.get("choices"))[:1]:
            answer.parts.append(_text(_map(choice.get("message")).get("content")))
    elif api is Api.COMPLETIONS:
        for choice in _list(data.get("choices"))[:1]:
            text = choice.get("text")
            answer.parts.append(text if isinstance(text, str) else "")
    elif api is Api.RESPONSES:
        for item in _list(data.get("output")):
            if item.get("type") == "message":
                answer.parts.append(_text(item.get("content")))
    else:
        answer.parts.append(_text(data.get("content")))


def _event(api: Api, data: Mapping[str, Any], answer: _Answer) -> None:
    """One server-sent event of a streamed answer of ``api``."""
    if api in (Api.CHAT, Api.COMPLETIONS):
        answer.meta(data)
        for choice in _list(data.get("choices")):
            if choice.get("index", 0) != 0:  # n > 1: the first choice, like the non-streamed reading
                continue
            piece = _map(choice.get("delta")).get("content") if api is Api.CHAT else choice.get("text")
            if isinstance(piece, str):
                answer.parts.append(piece)
        return
    kind = data.get("type")
    if api is Api.RESPONSES:
        if kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            answer.parts.append(data["delta"])
        elif isinstance(data.get("response"), Mapping):  # response.created ... response.completed
            answer.meta(data["response"])
        return
    if kind == "message_start":
        answer.meta(_map(data.get("message")))
    elif kind == "content_block_delta":
        delta = _map(data.get("delta"))
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            answer.parts.append(delta["text"])


def sse_data(raw: bytes) -> Iterator[bytes]:
    """The ``data`` of each complete server-sent event (multi-line data joined by newlines).

    An event cut off by the end of the stream is not complete and is not returned.
    """
    data: list[bytes] = []
    for line in raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")[:-1]:
        if not line:
            if data:
                yield b"\n".join(data)
            data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)


def read_exchange(api: Api, request: bytes, response: bytes, streamed: bool) -> Exchange | None:
    """The exchange in a relayed request and answer; None when there is nothing to fingerprint."""
    try:
        body = orjson.loads(request)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    answer = _Answer()
    if streamed:
        for data in sse_data(response):
            if data == b"[DONE]":
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                _event(api, event, answer)
    else:
        try:
            data = orjson.loads(response)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        _whole(api, data, answer)
    text = "".join(answer.parts)
    prompt = prompt_text(api, body)
    if not text or not prompt:
        return None
    model = answer.model or (body["model"] if isinstance(body.get("model"), str) else None)
    return Exchange(prompt, text, answer.request_id, model, answer.prompt_tokens)


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
