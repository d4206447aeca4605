"""ports: when the port's status last changed, as its host reported it (UP: its flows are in the switch)

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 04:10:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ports') as b:
        b.add_column(sa.Column('status_changed_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ports') as b:
        b.drop_column('status_changed_at')
