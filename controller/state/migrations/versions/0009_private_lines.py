"""private lines: a VLAN on the gateways' handoff into a VPC, its static routes, the prefixes its BGP sessions
accepted and the sessions' reported state; a gateway role is up to 16 characters (private-line)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 04:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('hosts') as batch:
        batch.alter_column('role', type_=sa.String(length=16), existing_type=sa.String(length=8),
                           existing_nullable=True)
    with op.batch_alter_table('host_tokens') as batch:
        batch.alter_column('role', type_=sa.String(length=16), existing_type=sa.String(length=8),
                           existing_nullable=True)
    op.create_table(
        'private_lines',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('tenant_id', sa.String(length=36), nullable=False),
        sa.Column('vpc_id', sa.String(length=36), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('vlan_id', sa.Integer(), nullable=False),
        sa.Column('customer_asn', sa.BigInteger(), nullable=False),
        sa.Column('customer_ip', sa.String(length=15), nullable=False),
        sa.Column('local_ip', sa.String(length=15), nullable=False),
        sa.Column('prefixlen', sa.Integer(), nullable=False),
        sa.Column('secondary_customer_ip', sa.String(length=15), nullable=True),
        sa.Column('secondary_local_ip', sa.String(length=15), nullable=True),
        sa.Column('md5_password', sa.String(length=80), nullable=True),
        sa.Column('max_prefixes', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.ForeignKeyConstraint(['vpc_id'], ['vpcs.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('vlan_id'),
        sa.UniqueConstraint('vpc_id', 'name', name='uq_private_line_vpc_name'),
    )
    op.create_index('ix_private_lines_tenant_id', 'private_lines', ['tenant_id'])
    op.create_index('ix_private_lines_vpc_id', 'private_lines', ['vpc_id'])
    op.create_table(
        'private_line_static_routes',
        sa.Column('line_id', sa.String(length=36), nullable=False),
        sa.Column('destination', sa.String(length=18), nullable=False),
        sa.ForeignKeyConstraint(['line_id'], ['private_lines.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('line_id', 'destination'),
    )
    op.create_table(
        'private_line_learned',
        sa.Column('line_id', sa.String(length=36), nullable=False),
        sa.Column('instance', sa.String(length=64), nullable=False),
        sa.Column('prefix', sa.String(length=18), nullable=False),
        sa.ForeignKeyConstraint(['line_id'], ['private_lines.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('line_id', 'instance', 'prefix'),
    )
    op.create_table(
        'private_line_sessions',
        sa.Column('line_id', sa.String(length=36), nullable=False),
        sa.Column('instance', sa.String(length=64), nullable=False),
        sa.Column('local_ip', sa.String(length=15), nullable=False),
        sa.Column('bgp_state', sa.String(length=16), nullable=False),
        sa.Column('bfd_state', sa.String(length=16), nullable=False),
        sa.Column('received', sa.Integer(), nullable=False),
        sa.Column('accepted', sa.Integer(), nullable=False),
        sa.Column('advertised', sa.Integer(), nullable=False),
        sa.Column('refused', sa.JSON(), nullable=False),
        sa.Column('last_error', sa.String(length=255), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['line_id'], ['private_lines.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('line_id', 'instance', 'local_ip'),
    )


def downgrade() -> None:
    op.drop_table('private_line_sessions')
    op.drop_table('private_line_learned')
    op.drop_table('private_line_static_routes')
    op.drop_index('ix_private_lines_vpc_id', 'private_lines')
    op.drop_index('ix_private_lines_tenant_id', 'private_lines')
    op.drop_table('private_lines')
    with op.batch_alter_table('host_tokens') as batch:
        batch.alter_column('role', type_=sa.String(length=8), existing_type=sa.String(length=16),
                           existing_nullable=True)
    with op.batch_alter_table('hosts') as batch:
        batch.alter_column('role', type_=sa.String(length=8), existing_type=sa.String(length=16),
                           existing_nullable=True)
