"""a service endpoint's own source address on the service network (what the service tells endpoints apart by)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 06:20:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('service_endpoints') as b:
        b.add_column(sa.Column('source_address', sa.String(length=15), nullable=True))
        b.create_unique_constraint('uq_service_endpoints_source_address', ['source_address'])


def downgrade() -> None:
    with op.batch_alter_table('service_endpoints') as b:
        b.drop_constraint('uq_service_endpoints_source_address', type_='unique')
        b.drop_column('source_address')
