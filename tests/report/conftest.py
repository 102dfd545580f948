"""Fixtures for the report tests: a quota store on SQLite and on PostgreSQL (own schema, dropped
after the session), helpers that write rows, and a runner for `gpuquota report`."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, delete, insert

from gpuquota.quota.report import cli
from gpuquota.quota.store import db
from gpuquota.quota.store.models import Allocation, Base, NamespaceLabels, NodeCapacity, QuotaSample
from tests.conftest import PgSchemas

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"


def exact_physical(units: int, physical: Fraction | float | None) -> Fraction:
    """The physical GPUs a test row stands for, exactly: ``units`` whole GPUs by default; a
    float is read as the small rational it was written as (2 / 7)."""
    if physical is None:
        return Fraction(units)
    return Fraction(physical).limit_denominator(1000)


def ts(text_: str) -> int:
    """Unix seconds of an RFC 3339 time (UTC when no offset)."""
    moment = datetime.fromisoformat(text_)
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


@dataclass
class Store:
    url: str
    engine: Engine
    _seq: int = 0

    def clear(self) -> None:
        with self.engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(delete(table))

    def alloc(
        self,
        namespace: str,
        start: int,
        end: int | None,
        *,
        units: int = 1,
        physical: Fraction | float | None = None,
        model: str | None = H100,
        resource: str = "nvidia.com/gpu",
        node: str = "node-1",
        pool: str | None = "pool-a",
        owner: tuple[str, str] | None = ("Job", "train"),
        cluster: str = "c1",
        estimated: bool = False,
        replicas: int | None = None,
        mig_profile: str | None = None,
        qos_class: str | None = "Guaranteed",
        pod: str | None = None,
    ) -> None:
        self._seq += 1
        with self.engine.begin() as conn:
            conn.execute(
                insert(Allocation).values(
                    cluster=cluster,
                    pod_uid=f"uid-{self._seq}",
                    namespace=namespace,
                    pod_name=pod or f"pod-{self._seq}",
                    owner_kind=owner[0] if owner else None,
                    owner_name=owner[1] if owner else None,
                    node=node,
                    node_pool=pool,
                    gpu_model=model,
                    resource_name=resource,
                    raw_units=units,
                    physical_gpus=float(exact_physical(units, physical)),
                    share_numerator=(exact_physical(units, physical) / units).numerator,
                    share_denominator=(exact_physical(units, physical) / units).denominator,
                    replicas=replicas,
                    sharing_strategy="time-slicing" if replicas else None,
                    started_at=start,
                    ended_at=end,
                    end_reason="vanished" if estimated else None,
                    estimated=estimated,
                    mig_profile=mig_profile,
                    qos_class=qos_class,
                    updated_at=start,
                )
            )

    def labels(
        self,
        namespace: str,
        labels: dict[str, str],
        start: int,
        end: int | None,
        cluster: str = "c1",
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(NamespaceLabels).values(
                    cluster=cluster,
                    namespace=namespace,
                    labels=labels,
                    valid_from=start,
                    valid_to=end,
                )
            )

    def capacity(
        self,
        node: str,
        start: int,
        end: int | None,
        *,
        units: int = 8,
        physical: Fraction | float | None = None,
        model: str | None = H100,
        pool: str | None = "pool-a",
        resource: str = "nvidia.com/gpu",
        cluster: str = "c1",
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(NodeCapacity).values(
                    cluster=cluster,
                    node=node,
                    node_pool=pool,
                    gpu_model=model,
                    resource_name=resource,
                    allocatable_units=units,
                    physical_gpus=float(exact_physical(units, physical)),
                    share_numerator=(exact_physical(units, physical) / units).numerator,
                    share_denominator=(exact_physical(units, physical) / units).denominator,
                    labels={},
                    started_at=start,
                    ended_at=end,
                )
            )

    def quota(
        self,
        namespace: str,
        at: int,
        hard: float,
        used: float,
        *,
        resource: str = "requests.nvidia.com/gpu",
        name: str = "gpu-quota",
        cluster: str = "c1",
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(QuotaSample).values(
                    cluster=cluster,
                    namespace=namespace,
                    quota_name=name,
                    resource_name=resource,
                    hard=hard,
                    used=used,
                    scopes=[],
                    observed_at=at,
                )
            )


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'store.db'}"
    db.upgrade(url)
    engine = create_engine(url)
    yield Store(url, engine)
    engine.dispose()


@pytest.fixture(scope="session")
def postgres_store(pg_schemas: PgSchemas) -> Iterator[Store]:
    url = pg_schemas.new("gq_report")
    db.upgrade(url)
    engine = create_engine(url)
    yield Store(url, engine)
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Store:
    s: Store = request.getfixturevalue(f"{request.param}_store")
    s.clear()
    return s


@dataclass
class Result:
    rc: int
    out: str
    err: str


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run `gpuquota report ARGS` in-process; returns rc, stdout, stderr."""

    def run(*argv: str, db: Store | str | None = None) -> Result:
        parser = argparse.ArgumentParser(prog="gpuquota report")
        cli.add_arguments(parser)
        extra = [] if db is None else ["--db", db if isinstance(db, str) else db.url]
        capsys.readouterr()
        rc = cli.run(parser.parse_args([*argv, *extra]))
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run
