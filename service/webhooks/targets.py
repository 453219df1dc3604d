"""Where incident events go: the targets of ``BLEEDWATCH_PAGING_TARGETS``, checked at start.

The setting is a JSON list; each target has a ``name`` (its key in the outbox, so keep it stable),
a ``type`` (``pagerduty``, ``slack`` or ``webhook``), the lowest ``min_severity`` it is paged for
and, optionally, the ``events`` it wants. Secrets are never inline: a target names the environment
variable that holds its routing key, Slack URL or signing secret (``*_env``), so the setting can
live in a ConfigMap while the secrets live in a Secret. docs/paging.md is the reference.

Everything an operator can get wrong is refused at start with a message naming the target and
the field, not at 3 a.m. when the first page fails to go out.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from service.findings.severity import SEVERITY_RANK, SeverityField

Event = Literal["opened", "escalated", "acknowledged", "resolved", "false_positive", "reopened"]
EVENTS: tuple[Event, ...] = ("opened", "escalated", "acknowledged", "resolved", "false_positive", "reopened")
LEGACY_TARGET = "webhook"  # BLEEDWATCH_WEBHOOK_URL's target: the outbox rows written before targets existed
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class _Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    min_severity: SeverityField = "low"
    events: tuple[Event, ...] = EVENTS
    # Tenant names in the notification (never any other tenant data); off where the channel is wide.
    include_tenants: bool = True


class PagerDutyTarget(_Target):
    type: Literal["pagerduty"]
    routing_key_env: str = Field(pattern=ENV_PATTERN)
    url: str = Field(PAGERDUTY_EVENTS_URL, pattern=r"^https?://")
    # Incidents of several bleedwatch installations on one PagerDuty service stay apart.
    dedup_key_prefix: str = Field("", max_length=64)
    min_severity: SeverityField = "high"


class SlackTarget(_Target):
    type: Literal["slack"]
    url_env: str = Field(pattern=ENV_PATTERN)  # the incoming-webhook URL is itself the credential


class WebhookTarget(_Target):
    type: Literal["webhook"]
    url: str = Field(pattern=r"^https?://")
    secret_env: str = Field(pattern=ENV_PATTERN)  # a Standard Webhooks secret, whsec_<base64>


TargetConfig = Annotated[PagerDutyTarget | SlackTarget | WebhookTarget, Field(discriminator="type")]
_TARGETS: TypeAdapter[list[TargetConfig]] = TypeAdapter(list[TargetConfig])
SETTING = "BLEEDWATCH_PAGING_TARGETS"


def _which(loc: tuple[int | str, ...], raw: object) -> str:
    """``[1] (slack 'ops')``: the target a pydantic error is about, as an operator would find it."""
    if not loc or not isinstance(loc[0], int):
        return ""
    index = loc[0]
    if isinstance(raw, list) and index < len(raw) and isinstance(raw[index], dict):
        kind, label = raw[index].get("type"), raw[index].get("name")
        return f"[{index}] ({kind} {label!r})" if label else f"[{index}] ({kind})"
    return f"[{index}]"


def parse(value: str | Sequence[object]) -> tuple[TargetConfig, ...]:
    """Targets from the setting's JSON; a ValueError whose message says which target and field is wrong."""
    try:
        raw: object = _TARGETS.validate_json(value) if isinstance(value, str) else _TARGETS.validate_python(value)
    except ValidationError as exc:
        raw_list: object = value
        if isinstance(value, str):
            try:
                raw_list = json.loads(value)
            except ValueError:
                raise ValueError(
                    f"{SETTING} must be a JSON list of targets, e.g. "
                    '[{"type": "slack", "name": "ops", "url_env": "SLACK_OPS_URL"}]'
                ) from None
        problems = []
        for error in exc.errors(include_url=False):
            which = _which(error["loc"], raw_list)
            if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
                problems.append(f"{which} type: one of pagerduty, slack, webhook")
            else:
                path = ".".join(str(part) for part in error["loc"][2:]) or "target"  # [1] is the type
                problems.append(f"{which} {path}: {error['msg']}")
        raise ValueError(f"{SETTING}: " + "; ".join(p.strip() for p in problems)) from None
    targets = tuple(raw) if isinstance(raw, list) else ()
    names = [t.name for t in targets]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"{SETTING}: target names must be unique (they key the outbox); repeated: {duplicated}")
    return targets


@dataclass(frozen=True, slots=True)
class Route:
    """What the outbox needs to decide who hears of an event, in the transaction that writes it."""

    name: str
    min_rank: int
    events: frozenset[str]

    def wants(self, event: str, severity: str) -> bool:
        return event in self.events and SEVERITY_RANK.get(severity, 1) >= self.min_rank


def route_of(target: TargetConfig) -> Route:
    return Route(target.name, SEVERITY_RANK[target.min_severity], frozenset(target.events))


LEGACY_ROUTE = Route(LEGACY_TARGET, 1, frozenset({"opened"}))  # as before targets: new incidents only


def secret(env: Mapping[str, str], variable: str) -> str:
    value = env.get(variable, "")
    if not value.strip():
        raise ValueError(f"the environment variable {variable} is not set (or empty)")
    return value


def check_secrets(targets: tuple[TargetConfig, ...], env: Mapping[str, str] | None = None) -> None:
    """Every secret a target names is set and well formed: refused at start, naming the variable."""
    env = os.environ if env is None else env
    problems = []
    for i, target in enumerate(targets):
        where = f"[{i}] ({target.type} {target.name!r})"
        try:
            if isinstance(target, PagerDutyTarget):
                key = secret(env, target.routing_key_env)
                if len(key.strip()) != 32:
                    raise ValueError(f"{target.routing_key_env} must hold a 32-character PagerDuty integration key")
            elif isinstance(target, SlackTarget):
                if not secret(env, target.url_env).startswith("https://"):
                    raise ValueError(f"{target.url_env} must hold the Slack incoming-webhook https:// URL")
            else:
                standard_secret(secret(env, target.secret_env), target.secret_env)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    if problems:
        raise ValueError(f"{SETTING}: " + "; ".join(problems))


def standard_secret(value: str, variable: str) -> str:
    """A Standard Webhooks secret: ``whsec_`` and base64 of 24 to 64 random bytes."""
    body = value.strip().removeprefix("whsec_")
    try:
        key = base64.b64decode(body + "==", validate=False)
    except (binascii.Error, ValueError):
        key = b""
    if not 24 <= len(key) <= 64:
        raise ValueError(
            f"{variable} must hold a Standard Webhooks secret: whsec_ and the base64 of 24 to 64 random bytes "
            "(python -c \"import base64, os; print('whsec_' + base64.b64encode(os.urandom(32)).decode())\")"
        )
    return value.strip()
