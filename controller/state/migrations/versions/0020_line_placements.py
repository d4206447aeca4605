"""private-line placements: where each session runs, kept while its instance lives

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 21:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('private_line_placements',
                    sa.Column('line_id', sa.String(length=36), sa.ForeignKey('private_lines.id', ondelete='CASCADE'),
                              primary_key=True),
                    sa.Column('session', sa.Integer(), primary_key=True, autoincrement=False),
                    sa.Column('instance', sa.String(length=64), nullable=False))


def downgrade() -> None:
    op.drop_table('private_line_placements')
