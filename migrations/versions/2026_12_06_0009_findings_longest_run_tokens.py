"""findings.longest_run_words becomes longest_run_tokens

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06

The column always held the tokens of the longest copy (service/matching/evidence.py: longest),
never words: the name now says so, as the API field does. The same key in each stored finding's
``evidence.sources[]`` is renamed too, so old and new findings read alike. No value changes.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BATCH = 1000

findings = sa.table(
    "findings",
    sa.column("id", sa.BigInteger()),
    sa.column("evidence", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")),
)


def upgrade() -> None:
    with op.batch_alter_table("findings") as batch_op:
        batch_op.alter_column("longest_run_words", new_column_name="longest_run_tokens")
    _rename_in_evidence("longest_run_words", "longest_run_tokens")


def downgrade() -> None:
    _rename_in_evidence("longest_run_tokens", "longest_run_words")
    with op.batch_alter_table("findings") as batch_op:
        batch_op.alter_column("longest_run_tokens", new_column_name="longest_run_words")


def _rename_in_evidence(old: str, new: str) -> None:
    """Each source summary's ``old`` key becomes ``new``, in place, by batches of ids (findings are few,
    and JSON edits differ between PostgreSQL and SQLite: Python does it alike on both)."""
    conn = op.get_bind()
    last = None
    while True:
        query = sa.select(findings.c.id, findings.c.evidence).order_by(findings.c.id).limit(BATCH)
        if last is not None:
            query = query.where(findings.c.id > last)
        rows = conn.execute(query).all()
        if not rows:
            return
        for finding_id, evidence in rows:
            renamed = _renamed(evidence, old, new)
            if renamed is not None:
                conn.execute(findings.update().where(findings.c.id == finding_id).values(evidence=renamed))
        last = rows[-1][0]


def _renamed(evidence: Any, old: str, new: str) -> dict[str, Any] | None:
    """The evidence with ``old`` renamed in its sources (key order kept), or None where none has it."""
    if not isinstance(evidence, dict) or not isinstance(evidence.get("sources"), list):
        return None
    if not any(isinstance(s, dict) and old in s for s in evidence["sources"]):
        return None
    sources = [
        {(new if k == old else k): v for k, v in s.items()} if isinstance(s, dict) else s for s in evidence["sources"]
    ]
    return evidence | {"sources": sources}
