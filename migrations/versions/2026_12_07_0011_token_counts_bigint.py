"""token counts and offsets are BIGINT

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07

Token counts and offsets are u32 on the wire, and a sender chooses them: a response claiming
2**31 tokens made the finding's INSERT fail on PostgreSQL (integer out of range), the batch was
dead-lettered, and with it every exchange judged with that response. SQLite's INTEGER already holds
64 bits; the change is PostgreSQL's, and rewrites these tables (findings and canaries are small).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = (
    ("findings", "prompt_tokens", True),
    ("findings", "response_tokens", False),
    ("findings", "longest_run_tokens", False),
    ("canaries", "token_count", False),
    ("canary_fingerprints", "offset", False),
)


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())


def _retype(old: sa.types.TypeEngine[int], new: sa.types.TypeEngine[int]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, existing_type=old, type_=new, existing_nullable=nullable)
