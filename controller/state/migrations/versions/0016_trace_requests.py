"""live traces: questions for a hypervisor's switch, delivered on its config stream, and its agent's answers

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 17:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('trace_requests',
                    sa.Column('id', sa.String(length=36), primary_key=True),
                    sa.Column('host', sa.String(length=64), nullable=False),
                    sa.Column('question', sa.JSON(), nullable=False),
                    sa.Column('answer', sa.JSON(), nullable=True),
                    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False))
    op.create_index('ix_trace_requests_host', 'trace_requests', ['host'])
    op.create_index('ix_trace_requests_created_at', 'trace_requests', ['created_at'])


def downgrade() -> None:
    op.drop_index('ix_trace_requests_created_at', 'trace_requests')
    op.drop_index('ix_trace_requests_host', 'trace_requests')
    op.drop_table('trace_requests')
