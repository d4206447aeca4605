"""ports: migrating_to, a live migration's destination host

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 00:20:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ports') as b:
        b.add_column(sa.Column('migrating_to', sa.String(length=64), nullable=True))
        b.create_foreign_key('fk_ports_migrating_to_hosts', 'hosts', ['migrating_to'], ['name'])


def downgrade() -> None:
    with op.batch_alter_table('ports') as b:
        b.drop_constraint('fk_ports_migrating_to_hosts', type_='foreignkey')
        b.drop_column('migrating_to')
