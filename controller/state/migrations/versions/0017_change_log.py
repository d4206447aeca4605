"""change log: what each write touched, at its revision (SQLite's stand-in for NOTIFY between worker processes)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 07:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('change_log',
                    sa.Column('revision', sa.BigInteger(), primary_key=True, autoincrement=False),
                    sa.Column('payload', sa.Text(), nullable=False))


def downgrade() -> None:
    op.drop_table('change_log')
