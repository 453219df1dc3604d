"""A queue item: the accepting request's id, the document refs of the batch's exchanges, the batch.

    <request id>[ <traceparent>] \\n @<ref>,<ref>,... \\n <batch JSON>

The request id names the request in logs and incident timelines (it never holds a space or a
newline: service/logging.py); the W3C ``traceparent`` of the accepting request, when it was
traced, makes the worker's spans part of the same trace (service/tracing.py).

The refs are given at acceptance, one pair per exchange (its prompt's ref and the next for its
response), not at processing: the index keeps, per tenant, the document
with the lowest ref (service/index/lua/common.lua) and ties between sources go to the lowest
ref, so findings follow the order batches were accepted in, not the order in which workers (or,
on a Redis Cluster, each node) happened to process them; and a batch processed twice writes its
documents under the same refs, so nothing is indexed twice. An item split into its exchanges, or
rewritten without a purged tenant's, keeps each exchange's refs. Items queued before refs were
given at acceptance have no ref line (a JSON body never starts with ``@``) and get refs when
processed.
"""

from __future__ import annotations


def wrap(request_id: str | bytes | None, refs: list[int] | None, body: bytes) -> bytes:
    rid = request_id.encode() if isinstance(request_id, str) else (request_id or b"")
    line = b"" if refs is None else b"@" + ",".join(map(str, refs)).encode() + b"\n"
    return rid + b"\n" + line + body


def origin(request_id: str | None, traceparent: str | None) -> str:
    """The first line's content: who accepted the batch, for logs and traces."""
    return f"{request_id or ''} {traceparent}" if traceparent else request_id or ""


def parse_origin(first_line: bytes) -> tuple[str | None, str | None]:
    """Request id and traceparent, each None when absent (items from before traces have no space)."""
    request_id, _, traceparent = first_line.decode().partition(" ")
    return request_id or None, traceparent or None


def unwrap(item: bytes) -> tuple[bytes, list[int] | None, bytes]:
    """Request id, each exchange's prompt ref (None in an item from before refs), body."""
    request_id, _, rest = item.partition(b"\n")
    if not rest.startswith(b"@"):
        return request_id, None, rest
    line, _, body = rest.partition(b"\n")
    return request_id, [int(r) for r in line[1:].split(b",")], body
