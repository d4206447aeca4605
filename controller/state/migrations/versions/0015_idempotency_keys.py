"""Idempotency-Key on creates: each credential's keys and the answers they got, kept a day

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 16:45:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('idempotency_keys',
                    sa.Column('credential', sa.String(length=64), primary_key=True),
                    sa.Column('key', sa.String(length=255), primary_key=True),
                    sa.Column('request', sa.String(length=64), nullable=False),
                    sa.Column('status', sa.Integer(), nullable=True),
                    sa.Column('body', sa.LargeBinary(), nullable=True),
                    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False))
    op.create_index('ix_idempotency_keys_created_at', 'idempotency_keys', ['created_at'])


def downgrade() -> None:
    op.drop_index('ix_idempotency_keys_created_at', 'idempotency_keys')
    op.drop_table('idempotency_keys')
