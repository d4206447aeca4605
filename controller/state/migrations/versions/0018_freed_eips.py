"""freed EIPs: when each released address was released (handed out again last)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 14:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('freed_eips',
                    sa.Column('address', sa.String(length=15), primary_key=True),
                    sa.Column('freed_at', sa.DateTime(timezone=True), nullable=False))


def downgrade() -> None:
    op.drop_table('freed_eips')
