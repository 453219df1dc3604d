"""Risk rules: loaded once from a TOML file, evaluated on a deployment's serving config.

The checks are code, a fixed set; which rules use them, with which fields, thresholds and
engine versions, is data (``rules.toml`` shipped with the package, or the file named by
``BLEEDWATCH_RISK_RULES_FILE``), so operators extend the list without a release.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from service.deployments.schemas import DeploymentConfig, Safeguards, Severity, Violation

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
ROLES = ("prefill", "decode")
SEVERITIES = ("critical", "high", "warning")
SAFEGUARDS = tuple(Safeguards.model_fields)
BOOLEAN_SAFEGUARDS = tuple(n for n in SAFEGUARDS if n != "kv_transfer_batch_cap")
INTEGER_SAFEGUARDS = ("kv_transfer_batch_cap",)


class RulesError(ValueError):
    """The rules file is not usable; the message names the file and the rule."""


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    check: str
    severity: Severity
    summary: str
    only_disaggregated: bool = False
    fields: tuple[str, ...] = ()
    maximum: int | None = None
    min_versions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    source: str

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rules]

    def evaluate(self, config: DeploymentConfig) -> list[Violation]:
        out = []
        for rule in self.rules:
            if rule.only_disaggregated and not config.disaggregated:
                continue
            details = CHECKS[rule.check](rule, config)
            if details:
                out.append(
                    Violation(rule=rule.name, severity=rule.severity, summary=rule.summary, detail="; ".join(details))
                )
        return out


def _n(value: int) -> str:
    return f"{value:,}"


def _pool(rule: Rule, c: DeploymentConfig) -> list[str]:
    pools = {"prefill": c.prefill_kv_pool_tokens, "decode": c.decode_kv_pool_tokens}
    return [
        f"the {role} KV pool holds {_n(pools[role])} tokens, less than the context length of {_n(c.context_length)}"
        for role in rule.fields
        if pools[role] < c.context_length
    ]


def _enabled(rule: Rule, c: DeploymentConfig) -> list[str]:
    values = c.safeguards.model_dump()
    return [f"{f} is {'not declared' if values[f] is None else 'off'}" for f in rule.fields if values[f] is not True]


def _disabled(rule: Rule, c: DeploymentConfig) -> list[str]:
    values = c.safeguards.model_dump()
    return [f"{f} is {'not declared' if values[f] is None else 'on'}" for f in rule.fields if values[f] is not False]


def _at_most(rule: Rule, c: DeploymentConfig) -> list[str]:
    out = []
    for f in rule.fields:
        value = c.safeguards.model_dump()[f]
        if value is None:
            out.append(f"{f} is not set: uncapped")
        elif rule.maximum is not None and value > rule.maximum:
            out.append(f"{f} is {_n(value)}, above the cap of {_n(rule.maximum)}")
    return out


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(.*)$")


def parse_version(text: str) -> tuple[tuple[int, ...], int] | None:
    """(release numbers, 0 for a pre-release such as rc1/dev, else 1); None if not a version.

    Enough for "is this at least the fixed release": 0.5.0rc1 < 0.5.0 = 0.5 < 0.5.0.post1.
    """
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    numbers = tuple(int(p) for p in match.group(1).split("."))
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers = numbers[:-1]
    rest = match.group(2).lower().lstrip(".-_")
    pre = 0 if re.match(r"^(a|alpha|b|beta|c|rc|pre|preview|dev)\d*", rest) else 1
    return numbers, pre


def _min_version(rule: Rule, c: DeploymentConfig) -> list[str]:
    minimum = rule.min_versions.get(c.engine) or rule.min_versions.get(c.engine.lower())
    if minimum is None:
        return []
    have, need = parse_version(c.engine_version), parse_version(minimum)
    if have is None:
        return [f"{c.engine} version '{c.engine_version}' cannot be compared with {minimum}, the first fixed one"]
    if need is not None and have < need:
        return [f"{c.engine} {c.engine_version} is older than {minimum}, the first version with the fix"]
    return []


CHECKS: dict[str, Callable[[Rule, DeploymentConfig], list[str]]] = {
    "kv_pool_at_least_context": _pool,
    "safeguard_enabled": _enabled,
    "safeguard_disabled": _disabled,
    "safeguard_at_most": _at_most,
    "engine_min_version": _min_version,
}


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        raise RulesError(f"{where}: give a non-empty list of names")
    return tuple(value)


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise RulesError(f"{where}: each [[rule]] must be a table")
    known = {"name", "check", "severity", "summary", "only_disaggregated", "roles", "fields", "field", "max"}
    known |= {"min_versions"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RulesError(f"{where}: unknown keys {', '.join(unknown)}")
    name, check, severity = raw.get("name"), raw.get("check"), raw.get("severity", "high")
    if not isinstance(name, str) or not NAME.match(name):
        raise RulesError(f"{where}: name must be lower_snake_case, at most 64 characters")
    where = f"{where} ({name})"
    if check not in CHECKS:
        raise RulesError(f"{where}: check must be one of {', '.join(CHECKS)}")
    if severity not in SEVERITIES:
        raise RulesError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    summary = raw.get("summary", "")
    only = raw.get("only_disaggregated", False)
    if not isinstance(summary, str) or not isinstance(only, bool):
        raise RulesError(f"{where}: summary must be a string and only_disaggregated true or false")
    fields: tuple[str, ...] = ()
    maximum = None
    versions: dict[str, str] = {}
    if check == "kv_pool_at_least_context":
        fields = _strings(raw.get("roles", list(ROLES)), f"{where}.roles")
        allowed: tuple[str, ...] = ROLES
    elif check in ("safeguard_enabled", "safeguard_disabled"):
        fields = _strings(raw.get("fields"), f"{where}.fields")
        allowed = BOOLEAN_SAFEGUARDS
    elif check == "safeguard_at_most":
        fields = _strings([raw.get("field")], f"{where}.field")
        allowed = INTEGER_SAFEGUARDS
        maximum = raw.get("max")
        if maximum is not None and (not isinstance(maximum, int) or isinstance(maximum, bool) or maximum < 1):
            raise RulesError(f"{where}.max: a positive integer")
    else:
        allowed = ()
        table = raw.get("min_versions")
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise RulesError(f'{where}.min_versions: a table of engine = "version"')
        for engine, version in table.items():
            if parse_version(version) is None:
                raise RulesError(f"{where}.min_versions.{engine}: '{version}' is not a version")
        versions = dict(table)
    bad = [f for f in fields if f not in allowed]
    if bad:
        raise RulesError(f"{where}: {', '.join(bad)} not among {', '.join(allowed)}")
    return Rule(name, check, severity, summary, only, fields, maximum, versions)


def parse_rules(text: str, source: str) -> RuleSet:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"{source}: not TOML ({exc})") from None
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        raise RulesError(f"{source}: rules are [[rule]] tables")
    rules = tuple(_rule(r, f"{source}: rule {i + 1}") for i, r in enumerate(raw_rules))
    names = [r.name for r in rules]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RulesError(f"{source}: rule names must be unique: {', '.join(duplicated)}")
    return RuleSet(rules, source)


def load_rules(path: Path | None = None) -> RuleSet:
    """The rules file named (BLEEDWATCH_RISK_RULES_FILE), else the one shipped with bleedwatch."""
    if path is not None:
        try:
            return parse_rules(path.read_text(encoding="utf-8"), str(path))
        except OSError as exc:
            raise RulesError(f"{path}: cannot read the rules file ({exc.strerror})") from None
    shipped = resources.files("service.deployments").joinpath("rules.toml")
    return parse_rules(shipped.read_text(encoding="utf-8"), "service/deployments/rules.toml")
