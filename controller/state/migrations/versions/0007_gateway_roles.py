"""a gateway host's role (nat, lb): which instances serve NAT gateways and which serve load balancers

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 08:45:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('hosts') as batch:
        batch.add_column(sa.Column('role', sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('hosts') as batch:
        batch.drop_column('role')
