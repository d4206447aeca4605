"""load balancers: VIPs, listeners, pools, members, health monitors

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 06:45:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('load_balancers',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('vpc_id', sa.String(length=36), nullable=False),
    sa.Column('subnet_id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('vip_port_id', sa.String(length=36), nullable=False),
    sa.Column('vip_address', sa.String(length=15), nullable=False),
    sa.Column('eip_id', sa.String(length=36), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['eip_id'], ['eips.id'], ),
    sa.ForeignKeyConstraint(['subnet_id'], ['subnets.id'], ),
    sa.ForeignKeyConstraint(['vip_port_id'], ['ports.id'], ),
    sa.ForeignKeyConstraint(['vpc_id'], ['vpcs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('eip_id'),
    sa.UniqueConstraint('vip_port_id'),
    sa.UniqueConstraint('vpc_id', 'name', name='uq_lb_vpc_name')
    )
    op.create_index(op.f('ix_load_balancers_subnet_id'), 'load_balancers', ['subnet_id'], unique=False)
    op.create_index(op.f('ix_load_balancers_tenant_id'), 'load_balancers', ['tenant_id'], unique=False)
    op.create_index(op.f('ix_load_balancers_vpc_id'), 'load_balancers', ['vpc_id'], unique=False)
    op.create_table('lb_pools',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('load_balancer_id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('protocol', sa.String(length=4), nullable=False),
    sa.Column('algorithm', sa.String(length=16), nullable=False),
    sa.Column('table_size', sa.Integer(), nullable=False),
    sa.Column('deregistration_delay_s', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['load_balancer_id'], ['load_balancers.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('load_balancer_id', 'name', name='uq_pool_lb_name')
    )
    op.create_index(op.f('ix_lb_pools_load_balancer_id'), 'lb_pools', ['load_balancer_id'], unique=False)
    op.create_index(op.f('ix_lb_pools_tenant_id'), 'lb_pools', ['tenant_id'], unique=False)
    op.create_table('lb_listeners',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('load_balancer_id', sa.String(length=36), nullable=False),
    sa.Column('protocol', sa.String(length=4), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('default_pool_id', sa.String(length=36), nullable=True),
    sa.Column('idle_timeout_s', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['default_pool_id'], ['lb_pools.id'], ),
    sa.ForeignKeyConstraint(['load_balancer_id'], ['load_balancers.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('load_balancer_id', 'protocol', 'port', name='uq_listener_lb_proto_port')
    )
    op.create_index(op.f('ix_lb_listeners_default_pool_id'), 'lb_listeners', ['default_pool_id'], unique=False)
    op.create_index(op.f('ix_lb_listeners_load_balancer_id'), 'lb_listeners', ['load_balancer_id'], unique=False)
    op.create_index(op.f('ix_lb_listeners_tenant_id'), 'lb_listeners', ['tenant_id'], unique=False)
    op.create_table('lb_members',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('pool_id', sa.String(length=36), nullable=False),
    sa.Column('port_id', sa.String(length=36), nullable=False),
    sa.Column('protocol_port', sa.Integer(), nullable=False),
    sa.Column('weight', sa.Integer(), nullable=False),
    sa.Column('operating_status', sa.String(length=12), nullable=False),
    sa.Column('status_changed_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['pool_id'], ['lb_pools.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['port_id'], ['ports.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('pool_id', 'port_id', 'protocol_port', name='uq_member_pool_port')
    )
    op.create_index(op.f('ix_lb_members_pool_id'), 'lb_members', ['pool_id'], unique=False)
    op.create_index(op.f('ix_lb_members_port_id'), 'lb_members', ['port_id'], unique=False)
    op.create_index(op.f('ix_lb_members_tenant_id'), 'lb_members', ['tenant_id'], unique=False)
    op.create_table('lb_health_monitors',
    sa.Column('pool_id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('type', sa.String(length=12), nullable=False),
    sa.Column('interval_s', sa.Float(), nullable=False),
    sa.Column('timeout_s', sa.Float(), nullable=False),
    sa.Column('rise', sa.Integer(), nullable=False),
    sa.Column('fall', sa.Integer(), nullable=False),
    sa.Column('http_method', sa.String(length=8), nullable=True),
    sa.Column('url_path', sa.String(length=255), nullable=True),
    sa.Column('expected_codes', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['pool_id'], ['lb_pools.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('pool_id')
    )
    op.create_index(op.f('ix_lb_health_monitors_tenant_id'), 'lb_health_monitors', ['tenant_id'], unique=False)


def downgrade() -> None:
    for table in ('lb_health_monitors', 'lb_members', 'lb_listeners', 'lb_pools', 'load_balancers'):
        op.drop_table(table)
