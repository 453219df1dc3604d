"""The risk check's own settings (``BLEEDWATCH_RISK_*``), read beside the service's ``Settings``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RiskSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BLEEDWATCH_", extra="ignore")

    # A rules file replacing the shipped service/deployments/rules.toml.
    risk_rules_file: Path | None = None
    # Every replica recomputes the risk gauges from the database this often (and at start and on PUT).
    risk_refresh_seconds: float = Field(15.0, gt=0)
