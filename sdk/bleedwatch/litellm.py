"""bleedwatch for LiteLLM: a ``CustomLogger`` that fingerprints every completed chat call and ships it.

On a LiteLLM proxy, put a one-line file beside ``config.yaml``, ``bleedwatch_callbacks.py``::

    from bleedwatch.litellm import bleedwatch_callback

and add the config line::

    litellm_settings:
      callbacks: bleedwatch_callbacks.bleedwatch_callback

with ``BLEEDWATCH_URL``, ``BLEEDWATCH_API_KEY`` (an ingest key) and
``BLEEDWATCH_FINGERPRINT_KEY`` (hex, the gateway's key) in the proxy's environment. The
callback reads LiteLLM's documented callback arguments (``kwargs`` with
``standard_logging_object``, ``response_obj``, ``start_time``, ``end_time``); the tenant is the
LiteLLM team, else the organisation, else the virtual key's owner, else the key's hash: what the
proxy authenticated, never the OpenAI ``user`` field (the end user), which the caller writes
itself. A caller who could name the victim's tenant there would make a leaked answer look like
the victim's own text, and nothing would be found. The end user is kept under the tenant, as
``meta.end_user``. The deployment is the model deployment's id and the node its ``api_base``.
Text is hashed here, in a worker thread; only fingerprints leave the proxy. Do not turn on
LiteLLM's message redaction for this callback: a redacted exchange has nothing to fingerprint
and is skipped.

``litellm`` is not a dependency of bleedwatch: when it is installed this class subclasses its
``CustomLogger`` (so LiteLLM recognises it), otherwise a plain object with the same methods.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bleedwatch.client import BleedwatchClient
from bleedwatch.exchange import Scalar
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params

if TYPE_CHECKING:
    _CustomLogger = object
else:
    try:
        from litellm.integrations.custom_logger import CustomLogger as _CustomLogger
    except ImportError:  # LiteLLM not installed: the same interface, without the base class
        _CustomLogger = object

log = logging.getLogger("bleedwatch.litellm")

# Where the tenant comes from, first found wins: keys of standard_logging_object["metadata"],
# then of standard_logging_object itself. Only what the proxy's authentication sets: the key's
# team, organisation, owner (set when the key was made) or the key itself.
TENANT_FIELDS = (
    "user_api_key_team_id",
    "user_api_key_org_id",
    "user_api_key_user_id",
    "user_api_key_hash",
)
# The caller's own ``user`` field (OpenAI's end-user id): chosen by the caller, so never a tenant.
# Refused in ``tenant_fields``; kept as ``meta.end_user`` under the authenticated tenant.
END_USER_FIELDS = ("user_api_key_end_user_id", "end_user")
CHAT_CALL_TYPES = frozenset({"completion", "acompletion"})
REDACTED = "redacted-by-litellm"


@dataclass(frozen=True, slots=True)
class LiteLLMExchange:
    tenant: str
    request_id: str
    model: str
    prompt: str
    response: str
    ts: float | None
    meta: dict[str, Scalar]


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(str(_get(p, "text")) for p in content if _get(p, "type") == "text" and _get(p, "text"))
    return ""


def _epoch(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _first(metadata: Any, slo: Any, fields: Sequence[str]) -> str | None:
    return next((str(v) for f in fields if (v := _get(metadata, f) or _get(slo, f)) not in (None, "")), None)


def _check_tenant_fields(fields: Sequence[str]) -> tuple[str, ...]:
    spoofable = sorted(set(fields) & set(END_USER_FIELDS))
    if spoofable:
        raise ValueError(
            f"tenant_fields: {', '.join(spoofable)} is the caller's own end-user id, not an authenticated "
            "identity; a caller could name another tenant there and hide a leak"
        )
    return tuple(fields)


def exchange_from_callback(
    kwargs: Mapping[str, Any], response_obj: Any, start_time: Any, tenant_fields: Sequence[str] = TENANT_FIELDS
) -> LiteLLMExchange | None:
    """What one LiteLLM success callback says about a chat exchange, or None if it is not one."""
    tenant_fields = _check_tenant_fields(tenant_fields)
    slo = kwargs.get("standard_logging_object") or {}
    call_type = kwargs.get("call_type") or _get(slo, "call_type")
    if call_type is not None and call_type not in CHAT_CALL_TYPES:
        return None
    response = kwargs.get("complete_streaming_response") or response_obj
    choices = _get(response, "choices") or []
    if not choices:
        return None
    answer = _text(_get(_get(choices[0], "message"), "content"))
    messages = kwargs.get("messages") or _get(slo, "messages") or []
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return None
    texts = [t for t in (_text(_get(m, "content")) for m in messages) if t]
    if not texts or not answer or REDACTED in (*texts, answer):
        return None  # nothing to fingerprint, or LiteLLM's message redaction is on
    prompt = "\n\n".join(texts)
    metadata = _get(slo, "metadata") or {}
    tenant = _first(metadata, slo, tenant_fields)
    request_id = _get(response, "id") or _get(slo, "id") or kwargs.get("litellm_call_id")
    if tenant is None or not request_id:
        return None
    hidden = _get(slo, "hidden_params") or {}
    usage = _get(response, "usage")
    prompt_tokens = _get(usage, "prompt_tokens") or _get(slo, "prompt_tokens")
    meta: dict[str, Scalar] = {
        "deployment": _get(slo, "model_id") or _get(hidden, "model_id"),
        "node": _get(slo, "api_base") or _get(hidden, "api_base"),
        "prompt_tokens": prompt_tokens if isinstance(prompt_tokens, int) and prompt_tokens > 0 else None,
        "end_user": _first(metadata, slo, END_USER_FIELDS) or _get(kwargs.get("optional_params"), "user"),
    }
    model = _get(slo, "model_group") or kwargs.get("model") or _get(response, "model") or "unknown"
    return LiteLLMExchange(
        tenant=tenant,
        request_id=str(request_id),
        model=str(model),
        prompt=prompt,
        response=answer,
        ts=_epoch(_get(slo, "startTime")) or _epoch(start_time),
        meta={k: str(v)[:256] if isinstance(v, str) else v for k, v in meta.items() if v is not None},
    )


class BleedwatchLogger(_CustomLogger):
    """LiteLLM callback. Arguments default to ``BLEEDWATCH_URL``, ``BLEEDWATCH_API_KEY`` and
    ``BLEEDWATCH_FINGERPRINT_KEY`` (hex), read at the first call so the proxy can start first."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        fingerprint_key: bytes | None = None,
        *,
        tenant_fields: Sequence[str] = TENANT_FIELDS,
        params: Params = DEFAULT_PARAMS,
        flush_seconds: float = 1.0,
        client: BleedwatchClient | None = None,
    ) -> None:
        super().__init__()
        self._url = url
        self._api_key = api_key
        self._key = fingerprint_key
        self._tenant_fields = _check_tenant_fields(tenant_fields)
        self._params = params
        self._flush_seconds = flush_seconds
        self._client = client
        self._started = False
        self._lock = asyncio.Lock()
        self._misconfigured = False
        self.submitted = 0
        self.skipped = 0
        self.errors = 0

    async def _bleedwatch(self) -> tuple[BleedwatchClient, bytes] | None:
        async with self._lock:
            if self._key is None:
                key_hex = os.environ.get("BLEEDWATCH_FINGERPRINT_KEY", "")
                try:
                    self._key = bytes.fromhex(key_hex) if key_hex else None
                except ValueError:
                    self._key = None
            if self._client is None:
                url = self._url or os.environ.get("BLEEDWATCH_URL")
                api_key = self._api_key or os.environ.get("BLEEDWATCH_API_KEY")
                if url and api_key:
                    self._client = BleedwatchClient(url, api_key, flush_seconds=self._flush_seconds)
            if self._client is None or self._key is None:
                if not self._misconfigured:
                    log.error(
                        "bleedwatch callback not configured: set BLEEDWATCH_URL, BLEEDWATCH_API_KEY and "
                        "BLEEDWATCH_FINGERPRINT_KEY (hex); exchanges are not checked"
                    )
                    self._misconfigured = True
                return None
            if not self._started:
                await self._client.__aenter__()  # starts its periodic flush in this event loop
                self._started = True
            return self._client, self._key

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's hook for a successful call (the whole answer, also when it was streamed)."""
        try:
            exchange = exchange_from_callback(kwargs or {}, response_obj, start_time, self._tenant_fields)
            if exchange is None:
                self.skipped += 1
                return
            ready = await self._bleedwatch()
            if ready is None:
                self.skipped += 1
                return
            client, key = ready
            await client.submit_text(
                exchange.prompt,
                exchange.response,
                key=key,
                tenant=exchange.tenant,
                request_id=exchange.request_id,
                model=exchange.model,
                ts=exchange.ts,
                meta=exchange.meta,
                params=self._params,
            )
            self.submitted += 1
        except Exception as exc:  # a monitoring callback must never fail the proxy's request
            self.errors += 1
            log.error("bleedwatch callback failed: %s", type(exc).__name__)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """A failed call carries no answer: nothing to check."""

    async def flush(self) -> None:
        if self._client is not None and self._started:
            await self._client.flush()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._started = False


bleedwatch_callback = BleedwatchLogger()
"""The instance a LiteLLM proxy config names; configured from the environment at its first call."""
