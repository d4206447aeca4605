"""a host's VTEP entry is versioned on its own (hosts.vtep_revision, the `vteps` counter, removed_hosts), so a host
joining, leaving or moving its VTEP sends other hosts that one entry, not their whole configs

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 13:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('hosts', sa.Column('vtep_revision', sa.BigInteger(), nullable=False, server_default='0'))
    op.create_index('ix_hosts_vtep_revision', 'hosts', ['vtep_revision'])
    op.create_table('removed_hosts',
                    sa.Column('name', sa.String(length=64), primary_key=True),
                    sa.Column('revision', sa.BigInteger(), nullable=False, index=True))
    op.execute("INSERT INTO counters (name, value) SELECT 'vteps', value FROM counters WHERE name = 'topology'")


def downgrade() -> None:
    op.execute("DELETE FROM counters WHERE name = 'vteps'")
    op.drop_table('removed_hosts')
    op.drop_index('ix_hosts_vtep_revision', 'hosts')
    op.drop_column('hosts', 'vtep_revision')
