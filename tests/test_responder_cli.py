"""``bleedwatch incidents`` and ``bleedwatch findings``: a responder works an incident from a shell.

Against a real server (uvicorn on a loopback port, embedded backends): the commands go through
the API with the responder's key, so roles apply and reads are audited under that key.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.cli import main
from service.config import Settings
from service.local_server import local_server
from service.responder import _emit, moment
from tests.test_cli import create, embedded_env  # noqa: F401 (a fixture)
from tests.traffic import exchange, words


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_responder_works_an_incident_from_the_shell(
    embedded_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    assert main(["migrate"]) == 0
    _, ingest = create(capsys, "ingest")
    read_id, read = create(capsys, "read")
    triage_id, triage = create(capsys, "triage")
    _, admin = create(capsys, "admin")
    now = time.time()
    batch = [
        exchange("acme", "acme-1", words("argparse"), words("heapq", 0, 60), now - 5, node="n1", deployment="pd-1"),
        exchange("globex", "globex-1", words("csv"), words("argparse", 100, 160), now, node="n7", deployment="pd-1"),
    ]
    with local_server(create_app(embedded_env)) as url:
        posted = httpx.post(
            f"{url}/v1/exchanges", json={"exchanges": batch}, headers={"Authorization": f"Bearer {ingest}"}
        )
        assert posted.status_code == 202, posted.text
        reader = ("--url", url, "--api-key", read)
        responder = ("--url", url, "--api-key", triage)

        code, out, _ = run(capsys, "incidents", "list", "--status", "open", "--json", *reader)
        assert code == 0
        (incident,) = json.loads(out)
        assert (incident["source_tenants"], incident["recipient_tenants"]) == (["acme"], ["globex"])
        iid = str(incident["id"])

        code, out, _ = run(capsys, "incidents", "list", *reader)
        header, row = out.splitlines()
        assert header.split()[:3] == ["id", "status", "severity"]
        assert row.split()[:2] == [iid, "open"]
        code, out, _ = run(capsys, "incidents", "list", "--csv", "--since", "1h", *reader)
        assert next(iter(csv.DictReader(io.StringIO(out))))["source_tenants"] == "acme"

        code, out, _ = run(capsys, "incidents", "show", iid, *reader)
        assert code == 0
        assert out.splitlines()[:2] == [f"id:                {iid}", "status:            open"]
        assert "globex-1" in out
        assert "opened" in out

        code, out, err = run(capsys, "findings", "list", "--source-tenant", "acme", "--since", "10m", "--json", *reader)
        assert code == 0, err
        (finding,) = json.loads(out)
        assert (finding["recipient_request_id"], finding["node"]) == ("globex-1", "n7")

        # A read key cannot change an incident: the API's own words, exit 1, nothing changed.
        code, _, err = run(capsys, "incidents", "ack", iid, *reader)
        assert code == 1
        assert err.startswith("403 forbidden:")

        code, out, _ = run(capsys, "incidents", "ack", iid, "--assignee", "alice", "--notes", "paged", *responder)
        assert (code, out) == (0, f"incident {iid}: acknowledged, assignee alice, 1 finding\n")

        code, out, _ = run(capsys, "incidents", "impact", iid, "--csv", *responder)
        rows = list(csv.DictReader(io.StringIO(out)))
        assert [(r["source_tenant"], r["recipient_tenant"], r["recipient_request_id"]) for r in rows] == [
            ("acme", "globex", "globex-1")
        ]
        code, out, _ = run(capsys, "incidents", "impact", iid, *responder)
        assert f"incident {iid}: 1 leaked response, 1 tenant pair\n" in out

        code, out, _ = run(capsys, "incidents", "false-positive", iid, *responder)
        assert code == 0
        assert f"incident {iid}: false_positive" in out
        entries = re.search(r"allowlisted what its findings matched: entries (\d+)", out)
        assert entries
        allowlist = httpx.get(f"{url}/v1/allowlist", headers={"Authorization": f"Bearer {admin}"}).json()
        assert int(entries.group(1)) in [e["id"] for e in allowlist["items"]]

        code, _, err = run(capsys, "incidents", "resolve", iid, *responder)  # false_positive -> resolved: 409
        assert (code, err) == (
            1,
            "409 conflict: status: an incident that is false_positive cannot become resolved, only open\n",
        )
        code, out, _ = run(capsys, "incidents", "reopen", iid, *responder)
        assert (code, out) == (
            0,
            f"incident {iid}: open, assignee alice, 1 finding\n"
            f"revoked 1 allowlist entry ({entries.group(1)}) that marking it a false positive had created\n",
        )
        allowlist = httpx.get(f"{url}/v1/allowlist", headers={"Authorization": f"Bearer {admin}"}).json()
        (entry,) = [e for e in allowlist["items"] if e["id"] == int(entries.group(1))]
        assert entry["revoked_at"] is not None
        assert run(capsys, "incidents", "resolve", iid, *responder)[0] == 0
        code, out, _ = run(capsys, "incidents", "reopen", iid, *responder)  # not from false_positive: nothing said
        assert (code, out) == (0, f"incident {iid}: open, assignee alice, 1 finding\n")

        code, _, err = run(capsys, "incidents", "show", "999999", *reader)
        assert (code, err) == (1, "404 not_found: no incident 999999\n")

        audit = httpx.get(f"{url}/v1/audit", params={"limit": 500}, headers={"Authorization": f"Bearer {admin}"})
        by_key = {(e["key_id"], e["action"]) for e in audit.json()["items"]}
    assert {(read_id, "incidents.list"), (read_id, "incidents.read"), (read_id, "findings.list")} <= by_key
    assert {(triage_id, "incidents.update"), (triage_id, "incidents.impact")} <= by_key


def test_without_a_key_or_a_server_it_says_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLEEDWATCH_API_KEY", raising=False)
    code, _, err = run(capsys, "incidents", "list")
    assert code == 2
    assert "BLEEDWATCH_API_KEY" in err
    code, _, err = run(capsys, "incidents", "list", "--url", "http://127.0.0.1:9", "--api-key", "bw_x_y")
    assert code == 1
    assert err.startswith("cannot reach bleedwatch at http://127.0.0.1:9")
    code, _, err = run(capsys, "incidents", "update", "1", "--api-key", "bw_x_y")
    assert code == 1
    assert "nothing to change" in err


def test_relative_times_become_utc() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", moment("2h"))
    assert moment("2026-12-02T10:00:00Z") == "2026-12-02T10:00:00Z"
    assert moment("2026-12-02") == "2026-12-02"
    assert moment("1796205600") == "1796205600"


def test_a_time_the_api_cannot_read_is_refused_before_any_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["findings", "list", "--since", "1w", "--url", "http://127.0.0.1:9", "--api-key", "bw_a_b"]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert "'1w' is not a duration ago (30s, 30m, 2h, 7d), an ISO 8601 time or epoch seconds" in capsys.readouterr().err


def test_version_completion_and_a_purge_that_asks_first(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"bleedwatch \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "incidents" in script
    assert "false-positive" in script
    code, _, err = run(capsys, "tenants", "purge", "acme")  # stdin is not a terminal under pytest
    assert code == 2
    assert "--yes" in err


def test_csv_cells_are_never_formulas() -> None:
    """Tenant names come from gateways: ``--csv`` quotes what a spreadsheet would run, as the impact
    report does, and leaves an unset value empty."""
    out = io.StringIO()
    rows = [{"id": 3, "source_tenants": ['=HYPERLINK("http://x")', "acme"], "assignee": None, "notes": "-1+2"}]
    _emit(rows, ["id", "source_tenants", "assignee", "notes"], argparse.Namespace(json=False, csv=True), out)
    assert list(csv.reader(io.StringIO(out.getvalue()))) == [
        ["id", "source_tenants", "assignee", "notes"],
        ["3", '\'=HYPERLINK("http://x"),acme', "", "'-1+2"],
    ]


def test_findings_list_shows_the_incident_and_leaves_out_what_was_closed(
    embedded_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A finding of an incident marked false positive was listed like a live one, so on-call
    triaged it again: each row now names its incident, the incident's status and the finding's
    own mark, and ``--live`` leaves such findings out."""
    assert main(["migrate"]) == 0
    _, ingest = create(capsys, "ingest")
    _, read = create(capsys, "read")
    _, triage = create(capsys, "triage")
    now = time.time()
    batch = [
        exchange("acme", "acme-1", words("argparse"), words("heapq", 0, 60), now - 5, deployment="pd-1"),
        exchange("globex", "globex-1", words("csv"), words("argparse", 100, 160), now, deployment="pd-1"),
        exchange("hooli", "hooli-1", words("json"), words("sqlite3", 0, 60), now - 5, deployment="pd-2"),
        exchange("initech", "initech-1", words("socket"), words("json", 100, 160), now, deployment="pd-2"),
    ]
    with local_server(create_app(embedded_env)) as url:
        posted = httpx.post(
            f"{url}/v1/exchanges", json={"exchanges": batch}, headers={"Authorization": f"Bearer {ingest}"}
        )
        assert posted.status_code == 202, posted.text
        reader = ("--url", url, "--api-key", read)
        code, out, _ = run(capsys, "findings", "list", "--json", *reader)
        by_recipient = {f["recipient_tenant"]: f for f in json.loads(out)}
        dismissed, live = by_recipient["globex"], by_recipient["initech"]
        assert (
            main(["incidents", "false-positive", str(dismissed["incident_id"]), "--url", url, "--api-key", triage]) == 0
        )
        capsys.readouterr()

        code, out, _ = run(capsys, "findings", "list", *reader)
        header, *rows = out.splitlines()
        assert header.split()[:5] == ["id", "severity", "incident_id", "incident_status", "false_positive"]
        cells = {row.split()[0]: row.split()[2:5] for row in rows}
        assert cells == {
            str(dismissed["id"]): [str(dismissed["incident_id"]), "false_positive", "True"],
            str(live["id"]): [str(live["incident_id"]), "open", "False"],
        }
        code, out, _ = run(capsys, "findings", "list", "--csv", *reader)
        by_id = {r["id"]: r for r in csv.DictReader(io.StringIO(out))}
        assert (by_id[str(dismissed["id"])]["incident_status"], by_id[str(dismissed["id"])]["false_positive"]) == (
            "false_positive",
            "True",
        )

        code, out, err = run(capsys, "findings", "list", "--live", "--json", *reader)
        assert code == 0, err
        assert [f["id"] for f in json.loads(out)] == [live["id"]]
        code, out, _ = run(capsys, "findings", "list", "--incident-status", "false_positive,resolved", "--csv", *reader)
        assert [r["id"] for r in csv.DictReader(io.StringIO(out))] == [str(dismissed["id"])]
        # Incidents take the same list of statuses.
        code, out, err = run(capsys, "incidents", "list", "--status", "open,acknowledged", "--json", *reader)
        assert code == 0, err
        assert [i["id"] for i in json.loads(out)] == [live["incident_id"]]
        code, out, _ = run(capsys, "incidents", "list", "--status", "false_positive,open", "--csv", *reader)
        listed = {r["id"] for r in csv.DictReader(io.StringIO(out))}
        assert listed == {str(dismissed["incident_id"]), str(live["incident_id"])}

    with pytest.raises(SystemExit) as exit_:  # refused before any call, naming the statuses
        main(["findings", "list", "--incident-status", "closed", "--url", "http://127.0.0.1:9", "--api-key", "bw_a_b"])
    assert exit_.value.code == 2
    assert "'closed': give one or more of open, acknowledged, resolved, false_positive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["incidents", "list", "--status", "open,closed", "--url", "http://127.0.0.1:9", "--api-key", "bw_a_b"])
    assert exit_.value.code == 2
    assert "'open,closed': give one or more of open, acknowledged, resolved" in capsys.readouterr().err
