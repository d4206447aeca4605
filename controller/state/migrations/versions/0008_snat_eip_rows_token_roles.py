"""an SNAT rule's EIPs as rows (in order, each once) instead of a comma-separated column; a gateway credential
bound to a role

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 20:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'snat_rule_eips',
        sa.Column('rule_id', sa.String(length=36), nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('eip_id', sa.String(length=36), nullable=False),
        sa.ForeignKeyConstraint(['rule_id'], ['snat_rules.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['eip_id'], ['eips.id']),
        sa.PrimaryKeyConstraint('rule_id', 'position'),
        sa.UniqueConstraint('rule_id', 'eip_id', name='uq_snat_rule_eip'),
    )
    op.create_index('ix_snat_rule_eips_eip_id', 'snat_rule_eips', ['eip_id'])
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, eip_ids FROM snat_rules")).all()
    for rule_id, eip_ids in rows:
        seen: list[str] = []
        for eid in (eip_ids or "").split(","):
            if eid and eid not in seen:  # the same EIP named twice was accepted before: kept once, first place
                seen.append(eid)
        for pos, eid in enumerate(seen):
            conn.execute(sa.text("INSERT INTO snat_rule_eips (rule_id, position, eip_id) VALUES (:r, :p, :e)"),
                         {"r": rule_id, "p": pos, "e": eid})
    with op.batch_alter_table('snat_rules') as batch:
        batch.drop_column('eip_ids')
    with op.batch_alter_table('host_tokens') as batch:
        batch.add_column(sa.Column('role', sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('host_tokens') as batch:
        batch.drop_column('role')
    with op.batch_alter_table('snat_rules') as batch:
        batch.add_column(sa.Column('eip_ids', sa.String(length=1024), nullable=False, server_default=''))
    conn = op.get_bind()
    for rule_id, eid in conn.execute(sa.text(
            "SELECT rule_id, eip_id FROM snat_rule_eips ORDER BY rule_id, position")).all():
        conn.execute(sa.text("UPDATE snat_rules SET eip_ids = CASE WHEN eip_ids = '' THEN :e "
                             "ELSE eip_ids || ',' || :e END WHERE id = :r"), {"r": rule_id, "e": eid})
    op.drop_table('snat_rule_eips')
