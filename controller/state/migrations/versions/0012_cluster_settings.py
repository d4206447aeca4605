"""what every controller replica shares: the admin credential's hash (and any later cluster-wide setting), so
replicas on one database need not share a state directory

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 10:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('cluster_settings',
                    sa.Column('name', sa.String(length=64), primary_key=True),
                    sa.Column('value', sa.Text(), nullable=False))


def downgrade() -> None:
    op.drop_table('cluster_settings')
