"""dual-stack VPCs: a VPC's IPv6 /56, a subnet's /64 (its router address and address mode), a port's IPv6
address, a security-group rule's ethertype; IPv6 CIDRs fit the rules' remote and the routes' destination. The
default groups get the IPv6 twins of their rules (egress anywhere, ingress from the group).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 15:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vpcs') as b:
        b.add_column(sa.Column('ipv6_cidr', sa.String(43), nullable=True))
        b.create_index('ix_vpcs_ipv6_cidr', ['ipv6_cidr'])
    with op.batch_alter_table('subnets') as b:
        b.add_column(sa.Column('ipv6_cidr', sa.String(43), nullable=True))
        b.add_column(sa.Column('ipv6_gateway_ip', sa.String(39), nullable=True))
        b.add_column(sa.Column('ipv6_address_mode', sa.String(16), nullable=True))
    with op.batch_alter_table('ports') as b:
        b.add_column(sa.Column('ipv6', sa.String(39), nullable=True))
        b.create_unique_constraint('uq_port_vpc_ipv6', ['vpc_id', 'ipv6'])
    with op.batch_alter_table('security_group_rules') as b:
        b.add_column(sa.Column('ethertype', sa.String(4), nullable=False, server_default='IPv4'))
        b.alter_column('remote_cidr', type_=sa.String(43), existing_type=sa.String(18), existing_nullable=True)
    with op.batch_alter_table('routes') as b:
        b.alter_column('destination', type_=sa.String(43), existing_type=sa.String(18), existing_nullable=False)
    op.execute("""
        INSERT INTO security_group_rules (group_id, direction, protocol, ethertype, remote_cidr, remote_group_id,
                                          description)
        SELECT r.group_id, r.direction, r.protocol, 'IPv6',
               CASE WHEN r.remote_cidr = '0.0.0.0/0' THEN '::/0' ELSE NULL END, r.remote_group_id, r.description
        FROM security_group_rules r JOIN security_groups g ON g.id = r.group_id
        WHERE g.is_default AND r.ethertype = 'IPv4' AND r.protocol = 'any'
          AND r.port_range_min IS NULL AND (r.remote_cidr = '0.0.0.0/0' OR r.remote_group_id IS NOT NULL)
    """)


def downgrade() -> None:
    op.execute("DELETE FROM security_group_rules WHERE ethertype = 'IPv6'")
    with op.batch_alter_table('routes') as b:
        b.alter_column('destination', type_=sa.String(18), existing_type=sa.String(43), existing_nullable=False)
    with op.batch_alter_table('security_group_rules') as b:
        b.alter_column('remote_cidr', type_=sa.String(18), existing_type=sa.String(43), existing_nullable=True)
        b.drop_column('ethertype')
    with op.batch_alter_table('ports') as b:
        b.drop_constraint('uq_port_vpc_ipv6', type_='unique')
        b.drop_column('ipv6')
    with op.batch_alter_table('subnets') as b:
        b.drop_column('ipv6_address_mode')
        b.drop_column('ipv6_gateway_ip')
        b.drop_column('ipv6_cidr')
    with op.batch_alter_table('vpcs') as b:
        b.drop_index('ix_vpcs_ipv6_cidr')
        b.drop_column('ipv6_cidr')
