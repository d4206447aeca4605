"""a VPC's MTU (what DHCP gives its VMs; at most the underlay's MTU less 50)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 06:20:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vpcs') as batch:
        batch.add_column(sa.Column('mtu', sa.Integer(), server_default='1450', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('vpcs') as batch:
        batch.drop_column('mtu')
