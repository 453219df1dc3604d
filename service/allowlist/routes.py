from __future__ import annotations

from typing import Annotated

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Path, Query

from bleedwatch.fingerprint.encoding import U64_LE
from service import audit
from service.allowlist import store
from service.allowlist.schemas import AllowlistIn, AllowlistMoreIn, AllowlistOut, AllowlistPage, Fingerprints, Label
from service.auth.deps import Admin
from service.deps import Deps, SessionDep
from service.errors import Conflict, Forbidden, Invalid, NotFound, PayloadTooLarge, Unauthorized, responses
from service.wire import decode_array

router = APIRouter(prefix="/v1/allowlist", tags=["allowlist"])
EntryId = Annotated[int, Path(ge=1, lt=2**63)]
# Per request, not per entry: 16 MB of values, 21 MB as base64, under the 32 MB body limit.
# A larger corpus is one entry built from several requests (``bleedwatch allowlist add`` sends 1M each).
MAX_FINGERPRINTS = 2_000_000


def _values(fingerprints: Fingerprints) -> npt.NDArray[np.uint64]:
    values = decode_array(fingerprints, U64_LE, "fingerprints").astype(np.uint64)
    if len(values) > MAX_FINGERPRINTS:
        raise PayloadTooLarge(
            f"fingerprints: {len(values)} in one request, more than {MAX_FINGERPRINTS}; "
            "send the rest to POST /v1/allowlist/{id}/fingerprints (bleedwatch allowlist add does)"
        )
    return values


@router.post(
    "",
    status_code=201,
    response_model=AllowlistOut,
    responses=responses(Unauthorized, Forbidden, PayloadTooLarge, Invalid),
)
async def add_entry(deps: Deps, session: SessionDep, caller: Admin, body: AllowlistIn) -> AllowlistOut:
    """Fingerprints that never make a finding under this key id, from now on, on every replica."""
    values = _values(body.fingerprints)
    entry = await store.add(session, body.key_id, body.label, "import", values, caller.key_id)
    await audit.record(
        session, caller, "allowlist.add", f"allowlist:{entry.id}", {"fingerprints": entry.fingerprint_count}
    )
    out = AllowlistOut.model_validate(entry)
    await session.commit()  # before every replica reloads the allowlist
    deps.known.invalidate(body.key_id)
    return out


@router.post(
    "/{entry_id}/fingerprints",
    response_model=AllowlistOut,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, PayloadTooLarge, Invalid),
)
async def add_fingerprints(
    deps: Deps, session: SessionDep, caller: Admin, entry_id: EntryId, body: AllowlistMoreIn
) -> AllowlistOut:
    """More fingerprints for an imported entry; values it already holds are ignored, so a retry is harmless."""
    values = _values(body.fingerprints)
    entry = await store.get_for_update(session, entry_id)
    if entry is None:
        raise NotFound(f"no allowlist entry {entry_id}")
    if entry.revoked_at is not None:
        raise Conflict(f"allowlist entry {entry_id} is revoked; add the text as a new entry")
    if entry.origin != "import":
        raise Conflict(f"allowlist entry {entry_id} was learnt from a false positive; add public text as its own")
    added = await store.append(session, entry, values)
    await audit.record(session, caller, "allowlist.append", f"allowlist:{entry_id}", {"fingerprints": added})
    out = AllowlistOut.model_validate(entry)
    await session.commit()  # before every replica reloads the allowlist
    deps.known.invalidate(out.key_id)
    return out


@router.get("", response_model=AllowlistPage, responses=responses(Unauthorized, Forbidden))
async def list_entries(
    session: SessionDep,
    _: Admin,
    key_id: Annotated[str | None, Query(pattern=r"^[0-9a-f]{16}$")] = None,
    label: Annotated[Label | None, Query()] = None,
) -> AllowlistPage:
    items = await store.entries(session, key_id, label)
    return AllowlistPage(items=[AllowlistOut.model_validate(e) for e in items])


@router.delete("/{entry_id}", response_model=AllowlistOut, responses=responses(Unauthorized, Forbidden, NotFound))
async def revoke_entry(deps: Deps, session: SessionDep, caller: Admin, entry_id: EntryId) -> AllowlistOut:
    """Revoked, not deleted: the entry stays listed with who revoked it and when."""
    entry = await store.revoke(session, entry_id, caller.key_id)
    if entry is None:
        raise NotFound(f"no allowlist entry {entry_id}")
    await audit.record(session, caller, "allowlist.revoke", f"allowlist:{entry_id}")
    out = AllowlistOut.model_validate(entry)
    await session.commit()  # before every replica reloads the allowlist
    deps.known.invalidate(out.key_id)
    return out
