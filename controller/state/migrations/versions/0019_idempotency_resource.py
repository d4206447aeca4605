"""idempotency keys: the resource the keyed write created, committed with it

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 21:20:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('idempotency_keys', sa.Column('resource', sa.String(length=300), nullable=True))


def downgrade() -> None:
    op.drop_column('idempotency_keys', 'resource')
