"""Schemathesis over the whole OpenAPI document, on the embedded default behind a real loopback server.

Every operation gets up to ``MAX_EXAMPLES`` generated requests (derandomized, so CI runs the same
ones every time), each sent with a key of every role. Checks: no 5xx, every status code, content
type, header and body is the one the schema declares. The run's statistics are printed
(``pytest -s tests/test_schema_fuzz.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Err, Ok

from service.app import create_app
from service.auth.keys import Role
from service.config import Settings
from service.local_server import local_server
from service.migrate import upgrade
from tests.conftest import _create_keys
from tests.incident_traffic import leak_pair

T = TypeVar("T")
E = TypeVar("E", bound=Exception)

MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _seed(url: str, tokens: dict[Role, str]) -> None:
    """An incident with findings and signals, so ids 1 and 2 exist for the generated requests."""
    ingest = {"Authorization": f"Bearer {tokens[Role.INGEST]}"}
    now = time.time()
    for text, recipient in (("argparse", "globex"), ("csv", "umbrella")):
        exchanges, _ = leak_pair(text, "acme", recipient, now)
        assert httpx.post(f"{url}/v1/exchanges", json={"exchanges": exchanges}, headers=ingest).status_code == 202
    event = {"kind": "kv_transfer_short", "deployment": "pd-eu-1", "node": "decode-3", "ts": now}
    assert httpx.post(f"{url}/v1/signals", json={"events": [event]}, headers=ingest).status_code == 202


def _ok(result: Ok[T] | Err[E]) -> T:
    """The operation, or the error schemathesis met building it from the schema."""
    if isinstance(result, Err):
        raise result.err()
    return result.ok()


def test_every_operation_answers_as_its_schema_says(tmp_path: Path) -> None:
    config = Settings(redis_url=None, database_url=None, data_dir=tmp_path / "data", rate_limit_per_second=0)
    upgrade(config)
    tokens = asyncio.run(_create_keys(config))
    statuses: Counter[int] = Counter()
    per_operation: dict[str, int] = {}
    with local_server(create_app(config)) as url, requests.Session() as session:
        _seed(url, tokens)
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [_ok(result) for result in schema.get_all_operations()]
        assert len(operations) >= 24

        for operation in operations:
            calls = 0

            @given(case=operation.as_strategy(), role=st.sampled_from(list(Role)))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: schemathesis.Case[Any], role: Role) -> None:
                nonlocal calls
                for key in (role, *(r for r in Role if r != role)):
                    headers = {"Authorization": f"Bearer {tokens[key]}"}
                    response = case.call_and_validate(base_url=url, session=session, headers=headers, checks=CHECKS)
                    statuses[response.status_code] += 1
                    calls += 1

            run()
            per_operation[operation.label] = calls

    print(f"\nschemathesis: {len(operations)} operations, {sum(statuses.values())} requests")
    print("  by status: " + ", ".join(f"{code}: {n}" for code, n in sorted(statuses.items())))
    for label, calls in sorted(per_operation.items()):
        print(f"  {label}: {calls}")
    assert not any(code >= 500 for code in statuses)
    assert statuses[200] > 0
    assert statuses[403] > 0


if __name__ == "__main__":
    pytest.main([__file__, "-s", "-q"])
