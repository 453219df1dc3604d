"""What each kind of target is sent for one incident event: URL, headers and body bytes.

Every body is built from ``Snapshot``: ids, status, severity, counts, model and deployment names,
tenant names (only where the target includes them) and links. bleedwatch holds no prompt or
response text, so none can be sent; these functions take nothing else to make sure of it.

- PagerDuty Events API v2 (https://developer.pagerduty.com/docs/events-api-v2/trigger-events/):
  ``trigger`` on opened, escalated and reopened (a trigger with the same ``dedup_key`` updates the
  open alert, so escalation raises its severity), ``acknowledge`` on acknowledged (the responder
  is on it, so PagerDuty stops escalating), ``resolve`` on resolved and false positive.
- Slack incoming webhooks (https://api.slack.com/messaging/webhooks): ``text`` (the notification
  and fallback) and ``blocks`` with the same summary and a link to the incident.
- Standard Webhooks (https://www.standardwebhooks.com/): ``webhook-id`` (the outbox row, the same
  on every retry), ``webhook-timestamp`` and ``webhook-signature``, signed by the
  ``standardwebhooks`` package; body ``{"type", "timestamp", "data"}`` as the spec recommends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from standardwebhooks import Webhook

from bleedwatch.plural import counted
from service.webhooks.outbox import short

USER_AGENT = "bleedwatch-webhook/1"
# bleedwatch's severities in PagerDuty's (critical, error, warning, info).
PAGERDUTY_SEVERITY = {"critical": "critical", "high": "error", "low": "warning"}
PAGERDUTY_ACTION = {
    "opened": "trigger",
    "escalated": "trigger",
    "reopened": "trigger",
    "acknowledged": "acknowledge",
    "resolved": "resolve",
    "false_positive": "resolve",
}
MAX_TENANTS_LISTED = 10  # a summary names a few; the incident page lists them all
SUMMARY_LIMIT = 1024  # PagerDuty's payload.summary limit


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An incident as a notification may show it: names, ids, counts, times and links, no text."""

    id: int
    status: str
    severity: str
    model: str
    deployment: str | None
    opened_at: datetime
    first_seen_at: datetime
    last_seen_at: datetime
    finding_count: int
    source_tenants: list[str]
    recipient_tenants: list[str]
    links: dict[str, str]

    def fields(self, *, tenants: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.status,
            "severity": self.severity,
            "model": self.model,
            "deployment": self.deployment,
            "opened_at": self.opened_at.isoformat(),
            "first_seen_at": self.first_seen_at.isoformat(),
            "last_seen_at": self.last_seen_at.isoformat(),
            "finding_count": self.finding_count,
            "source_tenant_count": len(self.source_tenants),
            "recipient_tenant_count": len(self.recipient_tenants),
        }
        if tenants:
            out["source_tenants"] = self.source_tenants
            out["recipient_tenants"] = self.recipient_tenants
        return out

    @property
    def where(self) -> str:
        return f"{self.model}" + (f" / {self.deployment}" if self.deployment else "")


@dataclass(frozen=True, slots=True)
class Request:
    url: str
    headers: dict[str, str]
    body: bytes


def _json_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Content-Type": "application/json", "User-Agent": USER_AGENT} | (extra or {})


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_TENANTS_LISTED])
    return shown + (f" and {len(names) - MAX_TENANTS_LISTED} more" if len(names) > MAX_TENANTS_LISTED else "")


def summary(event: str, incident: Snapshot, *, tenants: bool) -> str:
    """One line a pager or channel shows: what happened, how bad, where, how much; tenant names at most."""
    what = {
        "opened": "cross-tenant leak",
        "escalated": "cross-tenant leak escalated",
        "reopened": "cross-tenant leak reopened",
        "acknowledged": "acknowledged",
        "resolved": "resolved",
        "false_positive": "marked false positive",
    }[short(event)]
    line = (
        f"[{incident.severity.upper()}] bleedwatch incident {incident.id} {what} on {incident.where}: "
        f"{counted(incident.finding_count, 'finding')}"
    )
    if tenants:
        line += f"; from {_names(incident.source_tenants)} to {_names(incident.recipient_tenants)}"
    else:
        line += (
            f"; {len(incident.source_tenants)} source, {counted(len(incident.recipient_tenants), 'recipient tenant')}"
        )
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 1] + "…"


def pagerduty(url: str, routing_key: str, dedup_key: str, event: str, incident: Snapshot, *, tenants: bool) -> Request:
    """An Events API v2 event; ``payload`` only on a trigger, where PagerDuty requires it."""
    action = PAGERDUTY_ACTION[short(event)]
    body: dict[str, Any] = {"routing_key": routing_key, "event_action": action, "dedup_key": dedup_key}
    if action == "trigger":
        body["payload"] = {
            "summary": summary(event, incident, tenants=tenants),
            "source": incident.where,
            "severity": PAGERDUTY_SEVERITY.get(incident.severity, "warning"),
            "timestamp": incident.opened_at.isoformat(),
            "component": incident.model,
            "group": incident.deployment or incident.model,
            "class": "cross-tenant leak",
            "custom_details": incident.fields(tenants=tenants) | {"event": short(event)},
        }
        body["client"] = "bleedwatch"
        if incident.links["page"].startswith("http"):  # people click these: the responder UI's page
            body["client_url"] = incident.links["page"]
            body["links"] = [  # the page shows the impact per tenant pair and downloads its CSV
                {"href": incident.links["page"], "text": f"bleedwatch incident {incident.id}"}
            ]
    return Request(url, _json_headers(), orjson.dumps(body))


def _slack_escape(text: str) -> str:
    """Slack's three control characters (https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(url: str, event: str, incident: Snapshot, *, tenants: bool) -> Request:
    line = _slack_escape(summary(event, incident, tenants=tenants))
    link = incident.links["page"]
    linked = f"<{link}|Open incident {incident.id}>" if link.startswith("http") else f"incident path: {link}"
    body = {
        "text": f"{line} {linked}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{line}*"}},
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"status {incident.status} · first seen {incident.first_seen_at:%Y-%m-%d %H:%M} UTC"
                        f" · {linked}",
                    }
                ],
            },
        ],
    }
    return Request(url, _json_headers(), orjson.dumps(body))


def standard(url: str, secret: str, delivery_id: int, event: str, incident: Snapshot, *, tenants: bool) -> Request:
    """Signed as the Standard Webhooks spec says; ``webhook-id`` is the outbox row, stable across retries."""
    now = datetime.now(UTC)
    body = orjson.dumps(
        {
            "type": event,
            "timestamp": now.isoformat(),
            "data": {"incident": incident.fields(tenants=tenants), "links": incident.links},
        }
    )
    msg_id = f"msg_bleedwatch_{delivery_id}"
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body),
    }
    return Request(url, _json_headers(headers), body)
