"""SessionDep commits when the handler returns and before the response is sent, and rolls back on error."""

from __future__ import annotations

from types import SimpleNamespace, TracebackType
from typing import Any

import httpx
import pytest
import sqlalchemy.exc
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from service.deps import SessionDep

pytestmark = pytest.mark.anyio


class FakeSession:
    def __init__(self, log: list[str], fail_commit: bool) -> None:
        self.log = log
        self.fail_commit = fail_commit

    async def __aenter__(self) -> FakeSession:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.log.append("close")

    async def commit(self) -> None:
        self.log.append("commit")
        if self.fail_commit:
            raise sqlalchemy.exc.OperationalError("COMMIT", {}, OSError("connection lost"))

    async def rollback(self) -> None:
        self.log.append("rollback")


def _app(log: list[str], fail_commit: bool = False) -> FastAPI:
    app = FastAPI()
    app.state.deps = SimpleNamespace(sessions=lambda: FakeSession(log, fail_commit))

    @app.exception_handler(sqlalchemy.exc.OperationalError)
    async def database_down(_: Request, exc: Any) -> JSONResponse:
        return JSONResponse({"error": "unavailable"}, status_code=503)

    @app.get("/ok")
    async def ok(session: SessionDep) -> dict[str, bool]:
        log.append("handler")
        return {"ok": True}

    @app.get("/refused")
    async def refused(session: SessionDep) -> dict[str, bool]:
        log.append("handler")
        raise HTTPException(404, "no such thing")

    return app


async def _get(app: FastAPI, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await client.get(path)


async def test_the_session_commits_after_the_handler() -> None:
    log: list[str] = []
    assert (await _get(_app(log), "/ok")).status_code == 200
    assert log == ["handler", "commit", "close"]


async def test_a_failed_commit_answers_503_not_200() -> None:
    """The commit runs before the response is sent (scope="function"): lost work is never a 200."""
    log: list[str] = []
    assert (await _get(_app(log, fail_commit=True), "/ok")).status_code == 503
    assert log == ["handler", "commit", "rollback", "close"]


async def test_an_error_rolls_back() -> None:
    log: list[str] = []
    assert (await _get(_app(log), "/refused")).status_code == 404
    assert log == ["handler", "rollback", "close"]
