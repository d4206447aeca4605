"""a service endpoint's own source address (what the service tells endpoints apart by): on the service network, or
for a published load balancer a port of its own in the provider's VPC (provider_port_id)

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
        b.add_column(sa.Column('provider_port_id', sa.String(length=36), nullable=True))
        b.create_unique_constraint('uq_service_endpoints_source_address', ['source_address'])
        b.create_unique_constraint('uq_service_endpoints_provider_port_id', ['provider_port_id'])
        b.create_foreign_key('fk_service_endpoints_provider_port_id', 'ports', ['provider_port_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('service_endpoints') as b:
        b.drop_constraint('fk_service_endpoints_provider_port_id', type_='foreignkey')
        b.drop_constraint('uq_service_endpoints_provider_port_id', type_='unique')
        b.drop_constraint('uq_service_endpoints_source_address', type_='unique')
        b.drop_column('provider_port_id')
        b.drop_column('source_address')
