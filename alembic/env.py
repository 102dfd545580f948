"""Alembic environment of the quota store (shipped in the wheel as gpuquota/quota/migrations).

`gpuquota db upgrade` (gpuquota.quota.store.db) runs it with an open connection in
``config.attributes["connection"]``. Run by the alembic command itself, with an ini file whose
script_location points here, it connects to ``-x url=...`` or ``sqlalchemy.url``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from gpuquota.quota.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("no database URL: pass -x url=... or set sqlalchemy.url")
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: later migrations rebuild tables in batch mode
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
    else:
        engine = create_engine(_url())
        try:
            with engine.begin() as connection:
                _run(connection)
        finally:
            engine.dispose()
