"""The simulator's reporter logs why bleedwatch refused something by its error code, never a body."""

from __future__ import annotations

import httpx

from service.tools.sim.reporter import _error_code


def test_a_refusal_is_logged_by_its_code_not_its_body() -> None:
    refused = httpx.Response(422, json={"error": "invalid_request", "detail": "echoes of what was sent"})
    assert _error_code(refused) == "invalid_request"
    assert _error_code(httpx.Response(502, text="<html>proxy page quoting a prompt</html>")) == "(no JSON error body)"
    assert _error_code(httpx.Response(400, json=["not", "the", "error", "shape"])) == "(no error code)"
