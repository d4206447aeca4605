"""A counters row whose lock serialises VNI allocation.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    counters = sa.table("counters", sa.column("name", sa.String), sa.column("value", sa.BigInteger))
    op.bulk_insert(counters, [{"name": "vni", "value": 0}])


def downgrade() -> None:
    op.execute("DELETE FROM counters WHERE name = 'vni'")
