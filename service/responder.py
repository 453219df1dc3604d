"""``bleedwatch incidents`` and ``bleedwatch findings``: the responder's commands, over the REST API.

They go through the API with the responder's own key, not straight to the database like
``keys`` and ``prune``: reads are audited under that key and roles apply, exactly as with curl,
and a responder's laptop needs the URL and a key, not database credentials.

Output is a table for people; ``--json`` is the API's JSON unchanged (for jq and scripts) and
``--csv`` one row per item (the impact report's CSV is the API's own). Errors print the API's
``detail``, which says what to change, and exit 1; bad flags exit 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO, get_args

import httpx

from bleedwatch.plural import counted
from service.findings.severity import Severity
from service.incidents.schemas import Order, Sort, Status, check_statuses
from service.spreadsheet import safe_cell

PAGE = 500  # the API's largest page
_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class CommandError(Exception):
    """What went wrong, in the API's words or ours; printed without a traceback."""


def moment(value: str) -> str:
    """``30m``, ``2h`` or ``7d`` ago, in UTC, or an ISO 8601 time or epoch seconds passed on as given.

    Anything else is refused here: passed on, ``1w`` or ``2 h`` came back as the API's
    "input is too short", which does not say that a duration was meant.
    """
    relative = _RELATIVE.match(value)
    if relative is None:
        if not _absolute(value):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a duration ago (30s, 30m, 2h, 7d), an ISO 8601 time or epoch seconds"
            )
        return value
    amount, unit = relative.groups()
    then = datetime.now(UTC) - timedelta(**{_UNITS[unit]: int(amount)})
    return then.isoformat(timespec="seconds").replace("+00:00", "Z")


def _absolute(value: str) -> bool:
    """Whether the API can read ``value`` as a time (its ``Bound`` takes ISO 8601 and epoch seconds)."""
    for parse in (datetime.fromisoformat, float):
        try:
            parse(value)
        except ValueError:
            continue
        return True
    return False


class Api:
    def __init__(self, url: str, api_key: str) -> None:
        self._client = httpx.Client(
            base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        )

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *_: object) -> None:
        self._client.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CommandError(f"cannot reach bleedwatch at {self._client.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise CommandError(f"{response.status_code} {_detail(response)}")
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def pages(self, path: str, params: dict[str, Any], limit: int) -> Iterator[dict[str, Any]]:
        """Up to ``limit`` items, following ``next_cursor``."""
        left = limit
        query = {k: v for k, v in params.items() if v is not None}
        while left > 0:
            page = self.json("GET", path, params=query | {"limit": min(left, PAGE)})
            yield from page["items"][:left]
            left -= len(page["items"])
            if page["next_cursor"] is None or not page["items"]:
                return
            query["cursor"] = page["next_cursor"]


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
        return f"{body['error']}: {body['detail']}"
    except (ValueError, KeyError, TypeError):
        return response.reason_phrase


def _table(rows: list[dict[str, Any]], columns: list[str], out: TextIO) -> None:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    for line in [columns, *cells]:
        out.write("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _emit(rows: list[dict[str, Any]], columns: list[str], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
    elif args.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        cells = (("" if row.get(c) is None else safe_cell(_cell(row.get(c))) for c in columns) for row in rows)
        writer.writerows(cells)
    else:
        _table(rows, columns, out)


INCIDENT_COLUMNS = [
    "id",
    "status",
    "severity",
    "model",
    "deployment",
    "finding_count",
    "first_seen_at",
    "last_seen_at",
    "assignee",
    "source_tenants",
    "recipient_tenants",
]
FINDING_COLUMNS = [
    "id",
    "severity",
    "incident_id",
    "incident_status",
    "false_positive",
    "model",
    "deployment",
    "node",
    "prompt_tokens",
    "source_tenant",
    "recipient_tenant",
    "longest_run_tokens",
    "response_at",
]
INCIDENT_FINDING_COLUMNS = [
    "id",
    "severity",
    "incident_id",
    "incident_status",
    "false_positive",
    "source_tenant",
    "recipient_tenant",
    "recipient_request_id",
    "node",
    "prompt_tokens",
    "longest_run_tokens",
    "response_at",
    "false_positive",
]


def _list_incidents(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params = {
        "status": args.status,
        "severity": args.severity,
        "model": args.model,
        "deployment": args.deployment,
        "tenant": args.tenant,
        "since": args.since,
        "until": args.until,
        "sort": args.sort,
        "order": args.order,
    }
    _emit(list(api.pages("/v1/incidents", params, args.limit)), INCIDENT_COLUMNS, args, out)


def _show_incident(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    incident = api.json("GET", f"/v1/incidents/{args.id}")
    if args.json:
        json.dump(incident, out, indent=2)
        out.write("\n")
        return
    for name in (*INCIDENT_COLUMNS, "opened_at", "closed_at", "notes"):
        out.write(f"{name + ':':19}{_cell(incident.get(name))}\n")
    out.write(f"\nfindings ({len(incident['findings'])}):\n")
    _table(incident["findings"], INCIDENT_FINDING_COLUMNS, out)
    out.write("\ntimeline:\n")
    _table(incident["timeline"], ["at", "actor", "action", "detail"], out)


def _change(status: str | None) -> Callable[[Api, argparse.Namespace, TextIO], None]:
    def change(api: Api, args: argparse.Namespace, out: TextIO) -> None:
        body: dict[str, Any] = {} if status is None else {"status": status}
        if getattr(args, "assignee", None) is not None:
            body["assignee"] = args.assignee or None  # "" clears it
        if args.notes is not None:
            body["notes"] = args.notes
        if not body:
            raise CommandError("nothing to change: give --assignee or --notes")
        response = api.request("PATCH", f"/v1/incidents/{args.id}", json=body)
        incident = response.json()
        if args.json:
            json.dump(incident, out, indent=2)
            out.write("\n")
            return
        out.write(
            f"incident {incident['id']}: {incident['status']}, assignee {_cell(incident['assignee'])}, "
            f"{counted(incident['finding_count'], 'finding')}\n"
        )
        if status == "false_positive":
            entries = sorted({f["allowlist_entry_id"] for f in incident["findings"] if f["allowlist_entry_id"]})
            out.write(f"allowlisted what its findings matched: entries {_cell(entries)}\n")
        revoked = _revoked(incident, response.headers.get("x-request-id"))
        if revoked is not None:
            listed = f" ({_cell(revoked)})" if revoked else ""
            count = counted(len(revoked), "allowlist entry", "allowlist entries")
            out.write(f"revoked {count}{listed} that marking it a false positive had created\n")

    return change


def _revoked(incident: dict[str, Any], request_id: str | None) -> list[int] | None:
    """The allowlist entries revoked by this change, or None if it did not take the incident out of
    false_positive. Its findings no longer name them; its timeline does, in the events recorded under
    this request's id (the X-Request-Id of the answer)."""
    if request_id is None:
        return None
    events = [e for e in incident["timeline"] if e["request_id"] == request_id]
    if not any(e["action"] == "status" and e["detail"].get("before") == "false_positive" for e in events):
        return None
    restored = (e["detail"].get("allowlist_entry_id") for e in events if e["action"] == "finding_restored")
    return sorted({entry for entry in restored if entry is not None})


def _impact(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    if args.csv:
        out.write(api.request("GET", f"/v1/incidents/{args.id}/impact", params={"format": "csv"}).text)
        return
    report = api.json("GET", f"/v1/incidents/{args.id}/impact")
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
        return
    pairs = [
        {k: pair[k] for k in ("source_tenant", "recipient_tenant", "canary", "response_count")}
        | {
            "first": min(r["response_at"] for r in pair["responses"]),
            "last": max(r["response_at"] for r in pair["responses"]),
        }
        for pair in report["pairs"]
    ]
    responses = counted(report["response_count"], "leaked response")
    out.write(f"incident {args.id}: {responses}, {counted(len(pairs), 'tenant pair')}\n")
    _table(pairs, ["source_tenant", "recipient_tenant", "canary", "response_count", "first", "last"], out)


def _list_findings(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params = {
        "severity": args.severity,
        "model": args.model,
        "source_tenant": args.source_tenant,
        "recipient_tenant": args.recipient_tenant,
        "since": args.since,
        "until": args.until,
        "incident_status": args.incident_status or (LIVE if args.live else None),
        "false_positive": "false" if args.live else None,
    }
    _emit(list(api.pages("/v1/findings", params, args.limit)), FINDING_COLUMNS, args, out)


LIVE = "open,acknowledged"  # what --live keeps, with no finding marked false positive


def statuses(value: str) -> str:
    """``open,acknowledged``: refused here unless each is a status, with the API's own check and words."""
    try:
        return check_statuses(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: give {exc}") from None


def _show_finding(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    finding = api.json("GET", f"/v1/findings/{args.id}")
    if args.json:
        json.dump(finding, out, indent=2)
        out.write("\n")
        return
    for name, value in finding.items():
        out.write(f"{name + ':':24}{_cell(value)}\n")


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("BLEEDWATCH_URL", "http://127.0.0.1:8400"))
    p.add_argument("--api-key", default=os.environ.get("BLEEDWATCH_API_KEY"), help="default: BLEEDWATCH_API_KEY")


def _output(p: argparse.ArgumentParser, csv_help: str = "one row per item") -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="the API's JSON")
    g.add_argument("--csv", action="store_true", help=csv_help)


def _id(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("id", type=int, help=f"the {what} id")


def add_parsers(sub: Any) -> None:
    """``incidents`` and ``findings`` under the main parser's subcommands."""
    i = sub.add_parser("incidents", help="list, read and work incidents (a read key; triage to change them)")
    isub = i.add_subparsers(dest="incidents_command", required=True)
    il = isub.add_parser("list", help="incidents, newest activity first")
    il.add_argument(
        "--status",
        type=statuses,
        metavar="STATUS[,STATUS]",
        help=f"only incidents with one of these: {', '.join(s.value for s in Status)}",
    )
    il.add_argument("--severity", choices=[s.value for s in Severity])
    il.add_argument("--model")
    il.add_argument("--deployment")
    il.add_argument("--tenant", help="on either side")
    il.add_argument("--since", type=moment, help="leaked responses at or after: ISO 8601, or 30m, 2h, 7d ago")
    il.add_argument("--until", type=moment)
    il.add_argument("--sort", choices=get_args(Sort))
    il.add_argument("--order", choices=get_args(Order))
    il.add_argument("--limit", type=int, default=100, help="at most this many (pages are followed)")
    _output(il)
    il.set_defaults(action=_list_incidents)
    ish = isub.add_parser("show", help="one incident: its findings and timeline")
    _id(ish, "incident")
    ish.add_argument("--json", action="store_true")
    ish.set_defaults(action=_show_incident)
    for name, status, help_text in (
        ("ack", "acknowledged", "acknowledge: you are on it"),
        ("resolve", "resolved", "resolved: the cause is fixed"),
        ("false-positive", "false_positive", "not a leak: allowlists what its findings matched"),
        ("reopen", "open", "back to open (a false positive's allowlist entries are revoked)"),
        ("update", None, "change the assignee or notes only"),
    ):
        c = isub.add_parser(name, help=help_text)
        _id(c, "incident")
        c.add_argument("--assignee", help="who works it ('' clears it)")
        c.add_argument("--notes", help="replaces the incident's notes")
        c.add_argument("--json", action="store_true")
        c.set_defaults(action=_change(status))
    im = isub.add_parser("impact", help="who must be told: tenant pairs and their leaked responses")
    _id(im, "incident")
    _output(im, "one row per leaked response, to notify customers from")
    im.set_defaults(action=_impact)

    f = sub.add_parser("findings", help="list and read findings (a read key)")
    fsub = f.add_subparsers(dest="findings_command", required=True)
    fl = fsub.add_parser("list", help="findings, newest first")
    fl.add_argument("--severity", choices=[s.value for s in Severity])
    fl.add_argument("--model")
    fl.add_argument("--source-tenant")
    fl.add_argument("--recipient-tenant")
    fl.add_argument("--since", type=moment, help="detected at or after: ISO 8601, or 30m, 2h, 7d ago")
    fl.add_argument("--until", type=moment)
    fl.add_argument(
        "--incident-status",
        type=statuses,
        metavar="STATUS[,STATUS]",
        help=f"only findings whose incident has one of these: {', '.join(s.value for s in Status)}",
    )
    fl.add_argument(
        "--live",
        action="store_true",
        help=f"leave out what responders closed: findings marked false positive and, unless --incident-status "
        f"says otherwise, those of incidents not {LIVE.replace(',', ' or ')}",
    )
    fl.add_argument("--limit", type=int, default=100, help="at most this many (pages are followed)")
    _output(fl)
    fl.set_defaults(action=_list_findings)
    fs = fsub.add_parser("show", help="one finding, with its matched token ranges (never text)")
    _id(fs, "finding")
    fs.add_argument("--json", action="store_true")
    fs.set_defaults(action=_show_finding)
    for p in (
        il,
        ish,
        im,
        fl,
        fs,
        *(isub.choices[n] for n in ("ack", "resolve", "false-positive", "reopen", "update")),
    ):
        _connection(p)
    i.set_defaults(func=run)
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.api_key:
        print("give an API key: --api-key or BLEEDWATCH_API_KEY (read to look, triage to change)", file=sys.stderr)
        return 2
    if getattr(args, "limit", 1) < 1:
        print("--limit must be at least 1", file=sys.stderr)
        return 2
    try:
        with Api(args.url, args.api_key) as api:
            args.action(api, args, sys.stdout)
    except CommandError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
