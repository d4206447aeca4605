"""ports: an index on migrating_to (a host's reads ask `host = :h OR migrating_to = :h`)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 04:00:00
"""

from alembic import op


revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_ports_migrating_to', 'ports', ['migrating_to'])


def downgrade() -> None:
    op.drop_index('ix_ports_migrating_to', table_name='ports')
