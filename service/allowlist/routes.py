from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from service import audit
from service.allowlist import store
from service.allowlist.schemas import AllowlistIn, AllowlistOut, AllowlistPage
from service.auth.deps import require
from service.auth.keys import Caller, Role
from service.db import session_scope
from service.deps import Deps
from service.errors import Forbidden, Invalid, NotFound, PayloadTooLarge, Unauthorized, responses
from service.fingerprint.encoding import U64_LE
from service.ingest.decode import decode_array

router = APIRouter(prefix="/v1/allowlist", tags=["allowlist"])
Admin = Annotated[Caller, Depends(require(Role.ADMIN))]
MAX_FINGERPRINTS = 1_000_000


@router.post(
    "",
    status_code=201,
    response_model=AllowlistOut,
    responses=responses(Unauthorized, Forbidden, PayloadTooLarge, Invalid),
)
async def add_entry(deps: Deps, caller: Admin, body: AllowlistIn) -> AllowlistOut:
    """Fingerprints that never make a finding under this key id, from now on, on every replica."""
    values = decode_array(body.fingerprints, U64_LE, "fingerprints")
    if len(values) > MAX_FINGERPRINTS:
        raise PayloadTooLarge(f"fingerprints: more than {MAX_FINGERPRINTS} in one entry; split the file")
    async with session_scope(deps.sessions) as session:
        entry = await store.add(session, body.key_id, body.label, "import", values, caller.key_id)
        await audit.record(
            session, caller, "allowlist.add", f"allowlist:{entry.id}", {"fingerprints": entry.fingerprint_count}
        )
    deps.known.invalidate(body.key_id)
    return AllowlistOut.model_validate(entry)


@router.get("", response_model=AllowlistPage, responses=responses(Unauthorized, Forbidden))
async def list_entries(
    deps: Deps, _: Admin, key_id: Annotated[str | None, Query(pattern=r"^[0-9a-f]{16}$")] = None
) -> AllowlistPage:
    async with session_scope(deps.sessions) as session:
        return AllowlistPage(items=[AllowlistOut.model_validate(e) for e in await store.entries(session, key_id)])


@router.delete("/{entry_id}", response_model=AllowlistOut, responses=responses(Unauthorized, Forbidden, NotFound))
async def revoke_entry(deps: Deps, caller: Admin, entry_id: Annotated[int, Path(ge=1, lt=2**63)]) -> AllowlistOut:
    """Revoked, not deleted: the entry stays listed with who revoked it and when."""
    async with session_scope(deps.sessions) as session:
        entry = await store.revoke(session, entry_id, caller.key_id)
        if entry is None:
            raise NotFound(f"no allowlist entry {entry_id}")
        await audit.record(session, caller, "allowlist.revoke", f"allowlist:{entry_id}")
        out = AllowlistOut.model_validate(entry)
    deps.known.invalidate(out.key_id)
    return out
