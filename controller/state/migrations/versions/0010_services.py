"""services and their endpoints: what lives outside every VPC (the operator's, or a tenant's load balancer
published to other tenants) and its address in a consumer's subnet

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 13:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'services',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('name', sa.String(length=63), nullable=False),
        sa.Column('tenant_id', sa.String(length=36), nullable=True),
        sa.Column('addresses', sa.JSON(), nullable=False),
        sa.Column('ports', sa.JSON(), nullable=False),
        sa.Column('proxy_protocol', sa.Boolean(), nullable=False),
        sa.Column('load_balancer_id', sa.String(length=36), nullable=True),
        sa.Column('allowed_tenants', sa.JSON(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.ForeignKeyConstraint(['load_balancer_id'], ['load_balancers.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'),
        sa.UniqueConstraint('load_balancer_id'),
    )
    op.create_index('ix_services_tenant_id', 'services', ['tenant_id'])
    op.create_table(
        'service_endpoints',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('tenant_id', sa.String(length=36), nullable=False),
        sa.Column('vpc_id', sa.String(length=36), nullable=False),
        sa.Column('subnet_id', sa.String(length=36), nullable=False),
        sa.Column('service_id', sa.String(length=36), nullable=False),
        sa.Column('port_id', sa.String(length=36), nullable=False),
        sa.Column('address', sa.String(length=15), nullable=False),
        sa.Column('dns_name', sa.String(length=253), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.ForeignKeyConstraint(['vpc_id'], ['vpcs.id']),
        sa.ForeignKeyConstraint(['subnet_id'], ['subnets.id']),
        sa.ForeignKeyConstraint(['service_id'], ['services.id']),
        sa.ForeignKeyConstraint(['port_id'], ['ports.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('port_id'),
        sa.UniqueConstraint('vpc_id', 'service_id', name='uq_endpoint_vpc_service'),
    )
    for col in ('tenant_id', 'vpc_id', 'subnet_id', 'service_id'):
        op.create_index(f'ix_service_endpoints_{col}', 'service_endpoints', [col])


def downgrade() -> None:
    op.drop_table('service_endpoints')
    op.drop_table('services')
