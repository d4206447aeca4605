"""descriptions and tags on VPCs, subnets, ports and security groups (what lists filter on; no config reads them)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 16:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

TABLES = ('vpcs', 'subnets', 'ports', 'security_groups')


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as b:
            if table != 'security_groups':  # it had one
                b.add_column(sa.Column('description', sa.String(length=255), nullable=False, server_default=''))
            b.add_column(sa.Column('tags', sa.JSON(), nullable=False, server_default=sa.text("'[]'")))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as b:
            b.drop_column('tags')
            if table != 'security_groups':
                b.drop_column('description')
