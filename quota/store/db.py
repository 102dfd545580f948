"""The quota store: connect, migrate, and write batches of rows idempotently.

``open_store(url)`` connects to SQLite (a file, the default) or PostgreSQL (psycopg 3,
``postgresql+psycopg://``) and checks the schema is at the latest migration. ``Store.write``
applies one :class:`Batch` in one transaction with INSERT .. ON CONFLICT upserts keyed by
natural keys (pod UID and resource name for allocations), so writing the same batch twice, or
a batch that a crash interrupted, leaves the same rows. Merges in SQL never lengthen a closed
interval: an end only moves earlier, and a measured end replaces an estimated one.

For PostgreSQL, pass libpq options in the URL, e.g. a schema:
``postgresql+psycopg://user@host/db?options=-csearch_path%3Dgpuquota``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    case,
    create_engine,
    event,
    func,
    inspect,
    not_,
    or_,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import QueuePool

from gpuquota.quota.accounting.rows import (
    AllocationRow,
    Batch,
    ClaimAllocationRow,
    HeartbeatRow,
    NamespaceLabelsRow,
    NodeCapacityRow,
    QuotaSampleRow,
    StoredState,
)
from gpuquota.quota.accounting.rules.ends import END_REASON_PRECEDENCE
from gpuquota.quota.store.models import (
    Allocation,
    ClaimAllocation,
    Cluster,
    Gap,
    Heartbeat,
    NamespaceLabels,
    NodeCapacity,
    QuotaSample,
)

if TYPE_CHECKING:
    from alembic.config import Config

# alembic is imported where it is used: it is a second of start-up that only migrations need

DEFAULT_URL = "sqlite:///gpuquota.db"
ENV_URL = "GPUQUOTA_DB"


class StoreError(RuntimeError):
    """The database cannot be used (unreachable, wrong schema revision, bad URL): one line."""


class StoreUnavailableError(StoreError):
    """The database did not answer or failed a statement: the environment, not the input
    (exit 1 by the command-line convention, where a bad URL or an unmigrated store is 2)."""


# ---------------------------------------------------------------------------------------------
# Migrations


def migrations_path() -> Path:
    """Where the Alembic environment is: gpuquota/quota/migrations inside an installed wheel, else the
    repository's alembic/ folder (source checkout, editable install)."""
    packaged = importlib.resources.files("gpuquota.quota") / "migrations"
    if packaged.is_dir() and (packaged / "env.py").is_file():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[2] / "alembic"
    if (source / "env.py").is_file():
        return source
    raise StoreError("the quota store migrations are missing from this installation")


def _alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


# Revisions shipped under another id, and the id they have now. A store stamped with the old
# id is read as the new one and restamped by its next upgrade or downgrade (alembic knows
# only the new ids). The fleet history shipped as "i29_gpu_history" after "0010": a name
# that sorted before 0010 and read as "behind" in `db current`.
RENAMED = {"i29_gpu_history": "0011"}


def _restamp(connection: Connection) -> None:
    """Give a store stamped with a renamed revision its new id (in the caller's
    transaction)."""
    if "alembic_version" not in inspect(connection).get_table_names():
        return
    for old, new in RENAMED.items():
        connection.execute(
            text("UPDATE alembic_version SET version_num = :new WHERE version_num = :old"),
            {"new": new, "old": old},
        )


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid URL>"


class _SqliteReader:
    """Connections that never write to a SQLite store: read-only (``mode=ro``), or, where the
    folder cannot be written (a backup handed to finance, a read-only volume) and so WAL's
    shared-memory file cannot be made, ``immutable=1`` (no locks, no -shm), which is safe only
    when no write-ahead log holds data the main file lacks: else a clear refusal.

    A read-only connection to a WAL store makes its -wal and -shm files where they are missing
    (no process had the store open) and, being read-only, cannot remove them. So when the last
    of ours closes and the files were not there before the first, a plain connection is opened
    and closed: SQLite's last connection checkpoints an empty log (no page written) and removes
    both. A writer that opened the store meanwhile keeps them, as it must."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.uri = Path(path).resolve().as_uri()
        self.open = 0
        self.had_side_files = True
        self.lock = threading.Lock()  # report queries open connections from several threads

    def side_files(self) -> bool:
        return any(Path(f"{self.path}{suffix}").exists() for suffix in ("-wal", "-shm"))

    def connect(self) -> sqlite3.Connection:
        with self.lock:
            if self.open == 0:
                self.had_side_files = self.side_files()
            conn = self._connect()
            self.open += 1
            return conn

    def closed(self, dbapi_connection: sqlite3.Connection, *_: Any) -> None:
        # the pool's "close" event comes before the close: close it first (twice is harmless)
        dbapi_connection.close()
        with self.lock:
            self.open -= 1
            if self.open == 0 and not self.had_side_files and self.side_files():
                self._tidy()

    def _tidy(self) -> None:
        try:
            conn = sqlite3.connect(f"{self.uri}?mode=rw", uri=True, timeout=1)
        except sqlite3.Error:
            return  # a file we may not write: its side files stay, as SQLite left them
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error:
            pass
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        path, uri = self.path, self.uri
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30, check_same_thread=False)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens WAL's -shm
            return conn
        except sqlite3.OperationalError:
            conn.close()
            folder = Path(path).resolve().parent
            if os.access(folder, os.W_OK):
                raise
        wal = Path(f"{path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise sqlite3.OperationalError(
                f"its write-ahead log {wal} holds changes, and the folder {folder} is read-only: "
                "copy the store with `gpuquota db backup` (one file, no log) and read the copy"
            )
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)


# an engine's execution option: its connections may read side by side (PostgreSQL: each its own
# server process; a SQLite file's read-only connections: each its own, and Python's sqlite3
# lets go of the interpreter lock while SQLite works)
CONCURRENT_READS = "gpuquota_concurrent_reads"


def concurrent_reads(conn: Connection) -> bool:
    """Whether ``conn``'s store serves reads on several connections at once (``sibling``)."""
    return bool(conn.get_execution_options().get(CONCURRENT_READS))


def _engine(url: str, *, read_only: bool = False) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"invalid database URL {url!r}") from None
    kwargs: dict[str, Any] = {}
    in_file = parsed.get_backend_name() == "sqlite" and parsed.database not in (
        None,
        "",
        ":memory:",
    )
    if read_only and in_file and not str(parsed.database).startswith("file:"):
        assert parsed.database is not None
        reader = _SqliteReader(parsed.database)
        # a QueuePool: for a "sqlite://" URL SQLAlchemy would pick SingletonThreadPool, one
        # connection per thread that closes the connections of other threads once more than
        # five threads have used it, under a report's reader threads, mid-query: "Cannot
        # operate on a closed database", or a crash, from the second report on one connection
        engine = create_engine(
            "sqlite://",
            creator=reader.connect,
            poolclass=QueuePool,
            execution_options={CONCURRENT_READS: True},
        )
        event.listen(engine.pool, "close", reader.closed)
        return engine
    if parsed.get_backend_name() == "sqlite":
        # wait for a concurrent writer (the report, a second replay) instead of failing
        if "timeout" not in parsed.query:
            kwargs["connect_args"] = {"timeout": 30}
    elif parsed.get_backend_name() == "postgresql":
        kwargs["pool_pre_ping"] = True
        kwargs["connect_args"] = {"connect_timeout": 10}
        kwargs["execution_options"] = {CONCURRENT_READS: True}
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:
        hint = ""
        if parsed.get_backend_name() == "postgresql":
            hint = ": install the PostgreSQL driver with pip install 'gpuquota[postgres]'"
        raise StoreError(f"no driver for {safe_url(url)} ({exc}){hint}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            # readers (reports) never block the writer
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

    return engine


def _describe(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split()) or type(orig).__name__


def _connect_error(url: str, exc: DBAPIError) -> StoreError:
    """What a failed connection means: a file that is no SQLite database is bad input (the
    user named the wrong file, exit 2); anything else is a database that does not answer."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, sqlite3.DatabaseError) and "not a database" in str(orig):
        return StoreError(f"database {safe_url(url)}: the file is not a SQLite database")
    return StoreUnavailableError(f"cannot connect to database {safe_url(url)}: {_describe(exc)}")


def _missing_file(url: str) -> bool:
    """Whether ``url`` names a SQLite file that does not exist (opening it would create it)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"invalid database URL {url!r}") from None
    path = parsed.database or ""
    in_file = parsed.get_backend_name() == "sqlite" and path not in ("", ":memory:")
    try:
        return in_file and not path.startswith("file:") and not Path(path).exists()
    except OSError as exc:
        raise StoreError(f"database {safe_url(url)}: {exc.strerror or exc}") from None


def _require_existing_file(url: str) -> None:
    """A SQLite file that does not exist: StoreError, for opening it would create an empty one
    (only `gpuquota db upgrade` creates a store)."""
    if _missing_file(url):
        path = make_url(url).database
        raise StoreError(
            f"database {safe_url(url)}: file {path} does not exist "
            "(create it with `gpuquota db upgrade`)"
        )


@contextmanager
def _connected(url: str, *, create: bool = False, read_only: bool = False) -> Iterator[Connection]:
    if not create:
        _require_existing_file(url)
    engine = _engine(url, read_only=read_only)
    try:
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            raise _connect_error(url, exc) from None
        with connection:
            yield connection
    finally:
        engine.dispose()


def _check_revision(revision: str) -> None:
    """StoreError naming the known revisions when ``revision`` is none of them."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    if revision in ("head", "base") or revision.startswith(("+", "-")):
        return
    script = ScriptDirectory.from_config(_alembic_config())
    try:
        script.get_revisions(revision)
    except CommandError as exc:
        known = ", ".join(sorted(r.revision for r in script.walk_revisions()))
        raise StoreError(f"revision {revision!r}: {exc} (known: head, base, {known})") from None


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision`` (default: the latest)."""
    from alembic import command

    _check_revision(revision)
    with _connected(url, create=True) as connection:
        _restamp(connection)
        _refuse_foreign(connection, url)
        try:
            command.upgrade(_alembic_config(connection), revision)
            connection.commit()
        except SQLAlchemyError as exc:
            raise StoreError(f"migration of {safe_url(url)} failed: {_describe(exc)}") from None


def _refuse_foreign(
    connection: Connection, url: str, doing: str = "refusing to add gpuquota's tables to it"
) -> None:
    """StoreError for a database that holds tables but is no gpuquota store (no schema
    revision of ours): upgrading it would add our tables to someone else's data."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    # alembic's own bookkeeping table stays behind a downgrade to base: still ours, and empty
    tables = sorted(set(inspect(connection).get_table_names()) - {"alembic_version"})
    revision = MigrationContext.configure(connection).get_current_revision()
    ours = {r.revision for r in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}
    ours |= set(RENAMED)
    if revision in ours or not tables:
        return
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    why = f"its schema revision {revision!r} is not one of ours" if revision else "no revision"
    raise StoreError(
        f"database {safe_url(url)} is not a gpuquota store ({why}; it holds {shown}): {doing}; "
        "give an empty database or a gpuquota store"
    )


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` back to ``revision`` ("base" removes every table)."""
    from alembic import command

    _check_revision(revision)
    with _connected(url) as connection:
        try:
            _restamp(connection)
            command.downgrade(_alembic_config(connection), revision)
            connection.commit()
        except SQLAlchemyError as exc:
            raise StoreError(f"migration of {safe_url(url)} failed: {_describe(exc)}") from None


def current(url: str, *, refuse_foreign: bool = False) -> str | None:
    """The database's schema revision, None for an empty database; with ``refuse_foreign``
    StoreError for a database that holds tables of someone else's (upgrade refuses it)."""
    from alembic.runtime.migration import MigrationContext

    if _missing_file(url):
        return None  # as empty as it gets, and left uncreated
    with _connected(url, read_only=True) as connection:
        if refuse_foreign:  # a foreign database is no "empty store to upgrade"
            _refuse_foreign(connection, url, "it has no gpuquota schema revision to show")
        revision = MigrationContext.configure(connection).get_current_revision()
        return RENAMED.get(revision, revision) if revision is not None else None


def open_store(url: str = DEFAULT_URL, *, migrate: bool = False, read_only: bool = False) -> Store:
    """Connect to the store at ``url``; with ``migrate`` bring its schema to the latest
    revision first, else refuse a database that is not at it. ``read_only``: never write
    (a SQLite file is opened read-only, in a read-only folder too; see _SqliteReader)."""
    if migrate:
        upgrade(url)
    else:
        _require_existing_file(url)  # never leave an empty file behind
    revision = current(url)
    head = head_revision()
    if revision != head:
        found = "an empty database" if revision is None else f"revision {revision}"
        if revision is None:
            with _connected(url, read_only=True) as connection:
                _refuse_foreign(connection, url, "nothing to read")  # tables, none ours
        raise StoreError(
            f"database {safe_url(url)} has {found}, this version needs {head}: run `gpuquota db upgrade`"
        )
    return Store(url, _engine(url, read_only=read_only))


class StoreURLError(StoreError):
    """``--db`` is no database URL."""


def report_session(conn: Connection) -> Connection:
    """``conn`` with the session settings of the report's queries (PostgreSQL): they are short
    aggregates, so compiling them with LLVM (JIT) costs more than it saves; and grouping
    hundreds of thousands of rows in a hash table needs more than the default 4 MB, else
    PostgreSQL sorts on disk."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET jit = off"))
        conn.execute(text("SET work_mem = '64MB'"))
    return conn


@contextmanager
def sibling(conn: Connection) -> Iterator[Connection]:
    """Another report connection to the store behind ``conn`` (its engine's pool, the same
    session settings): for queries that run beside ``conn``'s (``concurrent_reads``)."""
    other = report_session(conn.engine.connect())
    with other:
        yield other


@contextmanager
def reading(url: str) -> Iterator[Connection]:
    """A read-only connection for a report: the store at ``url`` at the schema revision this
    version reads, with the session settings of the report's short aggregates on PostgreSQL.
    StoreURLError for no URL, StoreError for a missing file or a foreign or unmigrated store,
    StoreUnavailableError where the database does not answer."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreURLError(f"not a database URL: {url!r}") from None
    if parsed.get_backend_name() == "sqlite":
        # opening a missing SQLite file would create an empty one
        path = parsed.database
        try:
            missing = bool(path) and path != ":memory:" and not Path(path or "").exists()
        except OSError as exc:
            raise StoreError(f"database {safe_url(url)}: {exc.strerror}") from None
        if missing:
            raise StoreError(f"database {safe_url(url)}: file {path} does not exist")
    store = open_store(url, read_only=True)
    try:
        try:
            conn = report_session(store.engine.connect())
        except DBAPIError as exc:
            raise _connect_error(url, exc) from None
        with conn:
            yield conn
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------
# The store


def _rows(cluster: str, rows: Sequence[Any]) -> list[dict[str, Any]]:
    # a shallow read of the fields: dataclasses.asdict deep-copies every labels dict and
    # scopes list, which cost a third of a busy flush
    if not rows:
        return []
    names = [f.name for f in dataclasses.fields(rows[0])]
    return [{"cluster": cluster, **{n: getattr(row, n) for n in names}} for row in rows]


class Store:
    """Batched, idempotent writes and restart reads of the quota tables."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url
        self.engine = engine
        self.dialect = engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _insert(self, table: Any) -> Any:
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        if self.dialect == "sqlite":
            return sqlite.insert(table)
        raise StoreError(f"unsupported database {self.dialect}: use SQLite or PostgreSQL")

    def write(self, cluster: str, batch: Batch) -> None:
        """Apply ``batch`` in one transaction: all of it is stored or none of it is.

        Raises StoreError when the database fails; the caller keeps the batch and retries.
        """
        try:
            with self.engine.begin() as conn:
                self._write(conn, cluster, batch)
        except SQLAlchemyError as exc:
            raise StoreUnavailableError(
                f"write to {safe_url(self.url)} failed: {_describe(exc)}"
            ) from None

    def _write(self, conn: Connection, cluster: str, batch: Batch) -> None:
        # the cluster's data begins at this writer's first observation (kept if known already)
        created = batch.first_observed_at or batch.observed_at
        conn.execute(
            self._insert(Cluster.__table__)
            .values(name=cluster, created_at=created)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        if batch.allocations:
            conn.execute(self._allocation_upsert(), _rows(cluster, batch.allocations))
        if batch.claim_allocations:
            conn.execute(self._claim_upsert(), _rows(cluster, batch.claim_allocations))
        if batch.node_capacity:
            self._upsert(
                conn,
                NodeCapacity.__table__,
                ["cluster", "node", "resource_name", "started_at"],
                lambda t, ex: {
                    "node_pool": ex.node_pool,
                    "gpu_model": ex.gpu_model,
                    "allocatable_units": ex.allocatable_units,
                    "physical_gpus": ex.physical_gpus,
                    "share_numerator": ex.share_numerator,
                    "share_denominator": ex.share_denominator,
                    "mig_profile": ex.mig_profile,
                    "labels": ex.labels,
                    "ended_at": _earliest_end(t.c.ended_at, ex.ended_at),
                },
                _rows(cluster, batch.node_capacity),
            )
        if batch.namespace_labels:
            self._upsert(
                conn,
                NamespaceLabels.__table__,
                ["cluster", "namespace", "valid_from"],
                lambda t, ex: {
                    "labels": ex.labels,
                    "valid_to": _earliest_end(t.c.valid_to, ex.valid_to),
                },
                _rows(cluster, batch.namespace_labels),
            )
        if batch.quota_samples:
            stmt = self._insert(QuotaSample.__table__).on_conflict_do_nothing(
                index_elements=[
                    "cluster",
                    "namespace",
                    "quota_name",
                    "resource_name",
                    "observed_at",
                    "seq",
                ]
            )
            conn.execute(stmt, _rows(cluster, batch.quota_samples))
        if batch.gaps:
            self._upsert(
                conn,
                Gap.__table__,
                ["cluster", "kind", "started_at"],
                # the longer record of one gap wins (a replayed batch changes nothing)
                lambda t, ex: {
                    "ended_at": case((ex.ended_at > t.c.ended_at, ex.ended_at), else_=t.c.ended_at)
                },
                _rows(cluster, batch.gaps),
            )
        if batch.heartbeat is not None:
            t = Heartbeat.__table__
            stmt = self._insert(t)
            ex = stmt.excluded
            newer = ex.at >= t.c.at
            stmt = stmt.on_conflict_do_update(
                index_elements=["cluster"],
                set_={
                    "at": case((newer, ex.at), else_=t.c.at),
                    "holder": case((newer, ex.holder), else_=t.c.holder),
                    "resource_versions": case(
                        (newer, ex.resource_versions), else_=t.c.resource_versions
                    ),
                },
            )
            conn.execute(stmt, _rows(cluster, [batch.heartbeat]))

    def _upsert(
        self,
        conn: Connection,
        table: Any,
        key: list[str],
        updates: Callable[[Any, Any], dict[str, Any]],
        rows: list[dict[str, Any]],
    ) -> None:
        """INSERT ``rows`` into ``table``; a row whose ``key`` exists is updated with
        ``updates(table, excluded)`` instead."""
        stmt = self._insert(table)
        stmt = stmt.on_conflict_do_update(index_elements=key, set_=updates(table, stmt.excluded))
        conn.execute(stmt, rows)

    def _allocation_upsert(self) -> Any:
        t = Allocation.__table__
        stmt = self._insert(t)
        ex = stmt.excluded
        # the stored end is replaced only by an earlier one, or a measured end by an estimate
        # never: so a replayed, stale or duplicated event can't reopen or lengthen an interval
        # (at the same second, the reason that END_REASON_PRECEDENCE lists first is kept, so
        # the stored reason does not depend on which observation was flushed first)
        new_end_wins = or_(
            t.c.ended_at.is_(None),
            and_(
                ex.ended_at.is_not(None),
                or_(
                    and_(t.c.estimated, not_(ex.estimated)),
                    and_(t.c.estimated == ex.estimated, ex.ended_at < t.c.ended_at),
                    and_(
                        t.c.estimated == ex.estimated,
                        ex.ended_at == t.c.ended_at,
                        _reason_rank(ex.end_reason) < _reason_rank(t.c.end_reason),
                    ),
                ),
            ),
        )
        # node facts are recorded when the interval starts; fill them in only if unknown then
        node_unknown = t.c.gpu_model.is_(None)
        node_columns = (
            "node",
            "node_pool",
            "gpu_model",
            "physical_gpus",
            "share_numerator",
            "share_denominator",
            "replicas",
            "sharing_strategy",
            "mig_profile",
        )
        set_: dict[str, Any] = {
            name: ex[name]
            for name in (
                "namespace",
                "pod_name",
                "owner_kind",
                "owner_name",
                "raw_units",
                "started_at",
                "qos_class",
                "updated_at",
            )
        }
        for name in node_columns:
            set_[name] = case((node_unknown, ex[name]), else_=t.c[name])
        for name in ("ended_at", "end_reason", "estimated"):
            set_[name] = case((new_end_wins, ex[name]), else_=t.c[name])
        return stmt.on_conflict_do_update(
            index_elements=["cluster", "pod_uid", "resource_name"], set_=set_
        )

    def _claim_upsert(self) -> Any:
        """Claim rows are recomputed whole from the pods' intervals
        (quota/accounting/rules/claims.py charged_pieces): the engine's row replaces the stored one, except that the pod's own
        end, like an allocation's, only moves earlier and a measured end beats an estimate."""
        t = ClaimAllocation.__table__
        stmt = self._insert(t)
        ex = stmt.excluded
        keep_stored_end = and_(
            t.c.pod_ended_at.is_not(None),
            or_(
                ex.pod_ended_at.is_(None),
                and_(not_(t.c.estimated), ex.estimated),
                and_(t.c.estimated == ex.estimated, t.c.pod_ended_at < ex.pod_ended_at),
            ),
        )
        key = {"cluster", "claim_uid", "pod_uid", "resource_name", "id"}
        set_: dict[str, Any] = {c.name: ex[c.name] for c in t.columns if c.name not in key}
        # (and with it the piece it bounds: a stale copy never reopens a closed piece)
        for name in ("pod_ended_at", "end_reason", "estimated", "started_at", "ended_at"):
            set_[name] = case((keep_stored_end, t.c[name]), else_=ex[name])
        return stmt.on_conflict_do_update(
            index_elements=["cluster", "claim_uid", "pod_uid", "resource_name"], set_=set_
        )

    def load(self, cluster: str) -> StoredState:
        """Open intervals, current label sets, the latest quota samples and the heartbeat."""
        try:
            with self.engine.connect() as conn:
                return self._load(conn, cluster)
        except SQLAlchemyError as exc:
            raise StoreUnavailableError(
                f"read from {safe_url(self.url)} failed: {_describe(exc)}"
            ) from None

    def _load(self, conn: Connection, cluster: str) -> StoredState:
        def rows(cls: type[Any], stmt: Any) -> list[Any]:
            names = [f.name for f in dataclasses.fields(cls)]
            return [cls(**{n: row._mapping[n] for n in names}) for row in conn.execute(stmt)]

        a = Allocation.__table__
        allocations = rows(
            AllocationRow,
            select(a).where(a.c.cluster == cluster, a.c.ended_at.is_(None)).order_by(a.c.id),
        )
        n = NodeCapacity.__table__
        capacity = rows(
            NodeCapacityRow,
            select(n).where(n.c.cluster == cluster, n.c.ended_at.is_(None)).order_by(n.c.id),
        )
        ns = NamespaceLabels.__table__
        labels = rows(
            NamespaceLabelsRow,
            select(ns).where(ns.c.cluster == cluster, ns.c.valid_to.is_(None)).order_by(ns.c.id),
        )
        q = QuotaSample.__table__
        key = (q.c.namespace, q.c.quota_name, q.c.resource_name)
        latest = (
            select(*key, func.max(q.c.observed_at).label("observed_at"))
            .where(q.c.cluster == cluster)
            .group_by(*key)
            .subquery()
        )
        # of the latest second's samples, the last one (several changes in one second)
        samples_of_second = rows(
            QuotaSampleRow,
            select(q)
            .join(
                latest,
                and_(
                    q.c.namespace == latest.c.namespace,
                    q.c.quota_name == latest.c.quota_name,
                    q.c.resource_name == latest.c.resource_name,
                    q.c.observed_at == latest.c.observed_at,
                ),
            )
            .where(q.c.cluster == cluster)
            .order_by(q.c.seq),
        )
        last: dict[tuple[str, str, str], QuotaSampleRow] = {}
        for sample in samples_of_second:
            last[(sample.namespace, sample.quota_name, sample.resource_name)] = sample
        samples = list(last.values())
        h = Heartbeat.__table__
        beat = conn.execute(select(h).where(h.c.cluster == cluster)).first()
        heartbeat = (
            HeartbeatRow(
                holder=beat.holder, at=beat.at, resource_versions=dict(beat.resource_versions or {})
            )
            if beat is not None
            else None
        )
        c = ClaimAllocation.__table__
        open_claims = (
            select(c.c.claim_uid)
            .where(c.c.cluster == cluster, c.c.pod_ended_at.is_(None))
            .scalar_subquery()
        )
        claims = rows(
            ClaimAllocationRow,
            select(c)
            .where(c.c.cluster == cluster, c.c.claim_uid.in_(open_claims))
            .order_by(c.c.id),
        )
        return StoredState(allocations, capacity, labels, samples, heartbeat, claims)


def _earliest_end(stored: Any, new: Any) -> Any:
    """SQL for the earlier of two interval ends, where NULL means still open."""
    return case(
        (stored.is_(None), new),
        (new.is_(None), stored),
        (new < stored, new),
        else_=stored,
    )


def _reason_rank(reason: Any) -> Any:
    """SQL: a stored end reason's place in END_REASON_PRECEDENCE (estimates and unknowns last)."""
    return case(
        {name: rank for rank, name in enumerate(END_REASON_PRECEDENCE)},
        value=reason,
        else_=len(END_REASON_PRECEDENCE),
    )
