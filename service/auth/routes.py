"""``/v1/keys``: API keys for admins, beside ``bleedwatch keys`` (which needs no key, for the first one)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from service import audit
from service.auth import keys
from service.auth.deps import Admin
from service.auth.models import ApiKey
from service.auth.schemas import KeyCreated, KeyIn, KeyOut, KeyPage
from service.deps import Deps, SessionDep
from service.errors import NotFound, common_responses, responses

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=common_responses())
KeyIdPath = Annotated[str, Path(min_length=1, max_length=24, pattern=r"^[0-9a-f]+$")]
CREATED: dict[int | str, dict[str, Any]] = {201: {"model": KeyCreated, "description": "created"}}


@router.post("", status_code=201, response_model=KeyCreated, summary="Create an API key")
async def create_key(session: SessionDep, caller: Admin, body: KeyIn) -> KeyCreated:
    """The answer holds the secret, once. Ingest keys may be limited to the tenants of their gateway."""
    key, token = await keys.create_key(session, body.name, body.role, body.tenants)
    await audit.record(
        session, caller, "keys.create", f"key:{key.id}", {"role": key.role, "tenant_limited": bool(key.tenants)}
    )
    return KeyCreated(**KeyOut.model_validate(key).model_dump(), token=token)


@router.get("", response_model=KeyPage, summary="Every API key, without secrets")
async def list_keys(session: SessionDep, caller: Admin) -> KeyPage:
    rows = await keys.list_keys(session)
    await audit.record(session, caller, "keys.list", "keys")
    return KeyPage(items=[KeyOut.model_validate(k) for k in rows])


@router.delete("/{key_id}", response_model=KeyOut, responses=responses(NotFound), summary="Revoke an API key")
async def revoke_key(deps: Deps, session: SessionDep, caller: Admin, key_id: KeyIdPath) -> KeyOut:
    """Refused at once on this process, and on every other within a second (a Redis message)."""
    if not await keys.revoke_key(session, key_id):
        raise NotFound(f"no active API key {key_id}")
    await audit.record(session, caller, "keys.revoke", f"key:{key_id}")
    row = await session.get(ApiKey, key_id, populate_existing=True)
    assert row is not None
    out = KeyOut.model_validate(row)
    await session.commit()  # before any replica forgets the key, or one could reload it still active
    deps.keys.forget(key_id)
    await deps.revocations.publish(key_id)
    return out
