"""bleedwatch for LiteLLM: a ``CustomLogger`` that fingerprints every completed call and ships it.

On a LiteLLM proxy, put a one-line file beside ``config.yaml``, ``bleedwatch_callbacks.py``::

    from bleedwatch.litellm import bleedwatch_callback

and add the config line::

    litellm_settings:
      callbacks: bleedwatch_callbacks.bleedwatch_callback

with ``BLEEDWATCH_URL``, ``BLEEDWATCH_API_KEY`` (an ingest key) and
``BLEEDWATCH_FINGERPRINT_KEY`` (hex, the gateway's key) in the proxy's environment, and
``BLEEDWATCH_SPOOL_DIR`` (a directory) so that what bleedwatch cannot take while it is away is
kept on disk: each worker process claims its own spool there (``worker-<n>.spool``, by an flock
held for the process's life), and a restarted worker takes over the free slot and replays it.

Covered: ``completion``/``acompletion``, ``text_completion``/``atext_completion``,
``responses``/``aresponses`` and ``anthropic_messages``, plain or streamed (LiteLLM hands the
assembled answer to its success hooks once a stream ends). Both hooks hand exchanges to one
client per worker process, running on the callback's own event loop thread: sync calls reach
``log_success_event`` in a LiteLLM thread with no loop, and LiteLLM runs some async hooks on
short-lived loops (a sync stream's), where a client's queue would be stranded. Neither hook
waits for the network. The same exchange reported twice (LiteLLM calls both
hooks for some sync streams) is sent once.

The callback reads LiteLLM's documented callback arguments (``kwargs`` with
``standard_logging_object``, ``response_obj``, ``start_time``, ``end_time``); the tenant is the
LiteLLM team, else the organisation, else the virtual key's owner, else the key's hash: what the
proxy authenticated, never the OpenAI ``user`` field (the end user), which the caller writes
itself. A caller who could name the victim's tenant there would make a leaked answer look like
the victim's own text, and nothing would be found. The end user is kept under the tenant, as
``meta.end_user``. The deployment is the model deployment's id and the node its ``api_base``.
Text is hashed in the SDK's worker threads; only fingerprints leave the proxy. Do not turn on
LiteLLM's message redaction for this callback: a redacted exchange has nothing to fingerprint
and is skipped.

``litellm`` is not a dependency of bleedwatch-sdk: when it is installed this class subclasses its
``CustomLogger`` (so LiteLLM recognises it), otherwise a plain object with the same methods.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bleedwatch.client import BleedwatchClient
from bleedwatch.exchange import Scalar
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params, key_from_hex
from bleedwatch.limits import LABEL_MAX_CHARS, REQUEST_ID_MAX_CHARS

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
# LiteLLM's CallTypes values whose answers are text: chat, text completions, the Responses API and
# Anthropic's messages. Embeddings, images, audio and the rest carry no answer to check.
CALL_TYPES = frozenset(
    {
        "completion",
        "acompletion",
        "text_completion",
        "atext_completion",
        "responses",
        "aresponses",
        "anthropic_messages",
        "aanthropic_messages",
    }
)
CHAT_CALL_TYPES = CALL_TYPES  # the earlier name
# Content part types that hold text: chat ("text"), Responses API input and output, Anthropic blocks.
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
REDACTED = "redacted-by-litellm"
SPOOL_SLOTS = 4096  # worker-0 .. worker-4095: far above any proxy's worker count
_RECENT = 10_000  # (tenant, request id) pairs remembered to send an exchange reported twice once


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
    """A message's or a block's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(str(_get(p, "text")) for p in content if _get(p, "type") in TEXT_PARTS and _get(p, "text"))
    return ""


def _prompt(kwargs: Mapping[str, Any], slo: Any) -> list[str] | None:
    """The prompt's texts, in order: the call's ``messages``, else LiteLLM's normalised ones in
    the standard logging object (text completion prompts and Responses API input arrive as a
    message list there), else the raw ``input`` or ``prompt``; with a system prompt given apart (Anthropic's
    ``system``, the Responses API's ``instructions``). None when it is not text."""
    messages = kwargs.get("messages") or _get(slo, "messages") or kwargs.get("input") or kwargs.get("prompt") or []
    if isinstance(messages, str):
        messages = [messages]
    if not isinstance(messages, Sequence):
        return None
    texts = [m if isinstance(m, str) else _text(_get(m, "content")) for m in messages]
    optional = kwargs.get("optional_params")
    system = [_text(_get(optional, name)) for name in ("system", "instructions")]
    return [t for t in (*system, *texts) if t]


def _answer(response: Any) -> str:
    """The answer's text, whatever the call type: a chat choice's message, a text completion's
    ``text``, the Responses API's output messages, or Anthropic's content blocks."""
    choices = _get(response, "choices")
    if isinstance(choices, Sequence) and choices:
        choice = choices[0]
        message = _get(choice, "message")
        return _text(_get(message, "content")) if message is not None else _text(_get(choice, "text"))
    output = _get(response, "output")
    if isinstance(output, Sequence) and not isinstance(output, str):
        return "\n".join(t for t in (_text(_get(i, "content")) for i in output if _get(i, "type") == "message") if t)
    return _text(_get(response, "content"))


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


def _request_id(*candidates: Any) -> str | None:
    """The first id that fits the service's limit: LiteLLM's own call id, unique per call and the
    same in both reports of one call; the provider's response id only without it. Providers reuse
    theirs (Ollama's run chatcmpl-0 to 998), and the service keeps one exchange per tenant and id."""
    return next((str(c) for c in candidates if c and len(str(c)) <= REQUEST_ID_MAX_CHARS), None)


def exchange_from_callback(
    kwargs: Mapping[str, Any], response_obj: Any, start_time: Any, tenant_fields: Sequence[str] = TENANT_FIELDS
) -> LiteLLMExchange | None:
    """What one LiteLLM success callback says about an exchange, or None if it holds no text answer."""
    tenant_fields = _check_tenant_fields(tenant_fields)
    slo = kwargs.get("standard_logging_object") or {}
    call_type = kwargs.get("call_type") or _get(slo, "call_type")
    if call_type is not None and str(getattr(call_type, "value", call_type)) not in CALL_TYPES:
        return None
    response = (
        kwargs.get("complete_streaming_response")
        or kwargs.get("async_complete_streaming_response")
        or response_obj
        or _get(slo, "response")
    )
    answer = _answer(response)
    texts = _prompt(kwargs, slo)
    if not texts or not answer or REDACTED in (*texts, answer):
        return None  # nothing to fingerprint, or LiteLLM's message redaction is on
    metadata = _get(slo, "metadata") or {}
    tenant = _first(metadata, slo, tenant_fields)
    request_id = _request_id(kwargs.get("litellm_call_id"), _get(slo, "id"), _get(response, "id"))
    if tenant is None or request_id is None:
        return None
    hidden = _get(slo, "hidden_params") or {}
    usage = _get(response, "usage")
    prompt_tokens = _get(usage, "prompt_tokens") or _get(usage, "input_tokens") or _get(slo, "prompt_tokens")
    meta: dict[str, Scalar] = {
        "deployment": _get(slo, "model_id") or _get(hidden, "model_id"),
        "node": _get(slo, "api_base") or _get(hidden, "api_base"),
        "prompt_tokens": prompt_tokens if isinstance(prompt_tokens, int) and prompt_tokens > 0 else None,
        "end_user": _first(metadata, slo, END_USER_FIELDS) or _get(kwargs.get("optional_params"), "user"),
    }
    model = _get(slo, "model_group") or kwargs.get("model") or _get(response, "model") or "unknown"
    return LiteLLMExchange(
        tenant=tenant,
        request_id=request_id,
        model=str(model)[:LABEL_MAX_CHARS],
        prompt="\n\n".join(texts),
        response=answer,
        ts=_epoch(_get(slo, "startTime")) or _epoch(start_time),
        meta={k: v[:LABEL_MAX_CHARS] if isinstance(v, str) else v for k, v in meta.items() if v},
    )


def claim_spool(directory: str | os.PathLike[str]) -> tuple[Path, int]:
    """This process's spool in ``directory``: the first ``worker-<n>.spool`` whose ``worker-<n>.lock``
    no live process holds. The flock is held by the returned descriptor until the process ends,
    so a worker that dies frees its slot and its replacement replays what it left behind."""
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for n in range(SPOOL_SLOTS):
        fd = os.open(root / f"worker-{n}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return root / f"worker-{n}.spool", fd
    raise RuntimeError(f"{directory}: all {SPOOL_SLOTS} spool slots are held by live processes")


class BleedwatchLogger(_CustomLogger):
    """LiteLLM callback. Arguments default to ``BLEEDWATCH_URL``, ``BLEEDWATCH_API_KEY``,
    ``BLEEDWATCH_FINGERPRINT_KEY`` (hex) and ``BLEEDWATCH_SPOOL_DIR``, read at the first call so
    the proxy can start first and each forked worker claims its own spool.

    One ``BleedwatchClient`` per process, on the callback's own loop thread (an httpx client and
    its background sender belong to one loop). A ``client`` passed in (tests) is used instead, on
    the loop of the async hook that first reports."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        fingerprint_key: bytes | None = None,
        *,
        spool_dir: str | os.PathLike[str] | None = None,
        tenant_fields: Sequence[str] = TENANT_FIELDS,
        params: Params = DEFAULT_PARAMS,
        flush_seconds: float = 1.0,
        client: BleedwatchClient | None = None,
    ) -> None:
        super().__init__()
        self._url = url
        self._api_key = api_key
        self._key = fingerprint_key
        self._spool_dir = spool_dir
        self._no_spool = False  # set once the spool directory proved unusable
        self._tenant_fields = _check_tenant_fields(tenant_fields)
        self._params = params
        self._flush_seconds = flush_seconds
        self._given = client
        self._lock = threading.Lock()  # guards what follows; both hooks' threads touch it
        # The hooks' dedup has a lock of its own: it runs on the proxy's event loop, and ``_lock`` is
        # held while a client is built, which reads a whole spool left by an outage (seconds for 1 GB).
        self._recent_lock = threading.Lock()
        self._pid = os.getpid()
        self._clients: dict[asyncio.AbstractEventLoop, BleedwatchClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the sync hook's loop thread
        self._spool: Path | None = None
        self._slot_fd: int | None = None
        self._recent: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._misconfigured = False
        self.submitted = 0
        self.skipped = 0
        self.errors = 0

    # --- configuration -----------------------------------------------------------------------
    def _forked(self) -> None:
        """After a fork the parent's loop thread, clients and spool slot are not ours: start over."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._clients, self._loop, self._spool, self._slot_fd = {}, None, None, None
            self._recent_lock = threading.Lock()  # a parent's thread may have held it at the fork
            self._recent.clear()

    def _configured(self, need_url: bool) -> tuple[str, str, bytes] | None:
        """The service's URL, the ingest key and the fingerprint key, or None (logged once)."""
        problem = ""
        if self._key is None:
            key_hex = os.environ.get("BLEEDWATCH_FINGERPRINT_KEY", "")
            try:
                self._key = key_from_hex(key_hex) if key_hex else None
            except ValueError as exc:  # its message names the rule, never the key
                problem = f" ({exc})"
        url = self._url or os.environ.get("BLEEDWATCH_URL") or ""
        api_key = self._api_key or os.environ.get("BLEEDWATCH_API_KEY") or ""
        if self._key is None or (need_url and not (url and api_key)):
            if not self._misconfigured:
                log.error(
                    "bleedwatch callback not configured: set BLEEDWATCH_URL, BLEEDWATCH_API_KEY and "
                    "BLEEDWATCH_FINGERPRINT_KEY (hex)%s; exchanges are not checked",
                    problem,
                )
                self._misconfigured = True
            return None
        return url, api_key, self._key

    def _spool_path(self) -> Path | None:
        directory = self._spool_dir or os.environ.get("BLEEDWATCH_SPOOL_DIR")
        if directory and self._spool is None and not self._no_spool:
            try:
                self._spool, self._slot_fd = claim_spool(directory)
            except OSError as exc:
                self._without_spool(exc)
                return None
            log.info("bleedwatch spool for this worker: %s", self._spool)
        return self._spool

    def _without_spool(self, exc: OSError) -> None:
        """An unusable spool directory: exchanges are still checked, without a spool, rather than not at all."""
        self._no_spool = True
        log.error("bleedwatch: BLEEDWATCH_SPOOL_DIR unusable (%s); sending without a spool", type(exc).__name__)

    def _client_for(self, loop: asyncio.AbstractEventLoop) -> tuple[BleedwatchClient, bytes, bool] | None:
        """This loop's client and the key; True when the client is new and must be started."""
        with self._lock:
            self._forked()
            client = self._clients.get(loop)
            use_given = client is None and self._given is not None and not self._clients
            ready = self._configured(need_url=client is None and not use_given)
            if ready is None:
                return None
            url, api_key, key = ready
            if client is not None:
                return client, key, False
            if use_given:
                assert self._given is not None
                client = self._given
            else:
                spool = self._spool_path()
                try:
                    client = BleedwatchClient(url, api_key, flush_seconds=self._flush_seconds, spool=spool)
                except OSError as exc:  # the spool file itself could not be opened
                    self._without_spool(exc)
                    client = BleedwatchClient(url, api_key, flush_seconds=self._flush_seconds)
            self._clients[loop] = client
            return client, key, True

    def _first_time(self, exchange: LiteLLMExchange) -> bool:
        """False for an exchange already handed on: LiteLLM reports some calls twice."""
        key = (exchange.tenant, exchange.request_id)
        with self._recent_lock:
            if key in self._recent:
                return False
            self._recent[key] = None
            if len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
            return True

    # --- the hooks ---------------------------------------------------------------------------
    def _exchange(self, kwargs: Any, response_obj: Any, start_time: Any) -> LiteLLMExchange | None:
        exchange = exchange_from_callback(kwargs or {}, response_obj, start_time, self._tenant_fields)
        if exchange is None or not self._first_time(exchange):
            self.skipped += 1
            return None
        return exchange

    async def _submit(self, exchange: LiteLLMExchange) -> None:
        ready = self._client_for(asyncio.get_running_loop())
        if ready is None:
            self.skipped += 1
            return
        client, key, new = ready
        if new:
            await client.__aenter__()  # starts its periodic flush in this event loop
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

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's hook for a successful async call (the whole answer, also when it was streamed)."""
        try:
            exchange = self._exchange(kwargs, response_obj, start_time)
            if exchange is None:
                return
            if self._given is not None:
                await self._submit(exchange)
            else:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._submit(exchange), self._own_loop()))
        except Exception as exc:  # a monitoring callback must never fail the proxy's request
            self.errors += 1
            log.error("bleedwatch callback failed: %s", type(exc).__name__)

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's hook for a successful sync call, run in one of LiteLLM's threads: the exchange
        is handed to the callback's own loop thread and this returns without waiting for it."""
        try:
            exchange = self._exchange(kwargs, response_obj, start_time)
            if exchange is not None:
                future = asyncio.run_coroutine_threadsafe(self._submit(exchange), self._own_loop())
                future.add_done_callback(self._count_failure)
        except Exception as exc:  # as above: never into the caller's call
            self.errors += 1
            log.error("bleedwatch callback failed: %s", type(exc).__name__)

    def _count_failure(self, future: concurrent.futures.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.errors += 1
            log.error("bleedwatch callback failed: %s", type(future.exception()).__name__)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """A failed call carries no answer: nothing to check."""

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """A failed call carries no answer: nothing to check."""

    # --- the callback's own loop ------------------------------------------------------------
    def _own_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            self._forked()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="bleedwatch-litellm", daemon=True).start()
                self._loop = loop
                atexit.register(self._close_at_exit, loop)
            return self._loop

    def _close_at_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver (or spool) what is still queued before the interpreter ends."""
        if loop is self._loop and loop in self._clients:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._clients[loop].aclose(), loop).result(timeout=30)

    async def _on_each(self, action: str) -> None:
        """``flush`` or ``aclose`` every client, each on its loop."""
        here = asyncio.get_running_loop()
        with self._lock:
            clients = list(self._clients.items())
        for loop, client in clients:
            if loop.is_closed():
                continue
            coro: Coroutine[Any, Any, None] = getattr(client, action)()
            if loop is here:
                await coro
            else:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    async def flush(self) -> None:
        """Deliver what is queued now."""
        await self._on_each("flush")

    async def aclose(self) -> None:
        await self._on_each("aclose")
        with self._lock:
            self._clients.clear()


bleedwatch_callback = BleedwatchLogger()
"""The instance a LiteLLM proxy config names; configured from the environment at its first call."""
