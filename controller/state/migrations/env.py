"""Alembic environment: migrations run on controller start, on the connection handed in by `db.upgrade`."""

from alembic import context
from sqlalchemy import create_engine

from controller.state.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    conn = config.attributes.get("connection")
    if conn is None:  # `alembic` CLI use, e.g. autogenerate against a scratch database
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
        with engine.begin() as c:
            context.configure(connection=c, target_metadata=target_metadata, render_as_batch=True)
            context.run_migrations()
        return
    context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run()
