"""SQL building blocks every read of the report shares: clipping an interval to a sub-window
in the database (GREATEST/LEAST on PostgreSQL, the scalar MAX/MIN on SQLite) and bound times.

Every interval [start, end) is clipped to each sub-window [b_i, b_i+1), giving one SUM column
per sub-window in one scan; sub-windows are the report window split at rate changes (and at
chart buckets, covered-time edges), so pricing, charting and idle need no second pass.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Integer, cast, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import GenericFunction

FAR_FUTURE = 2**62


class greatest(GenericFunction[int]):  # noqa: N801 - SQL function name
    type = Integer()
    inherit_cache = True


class least(GenericFunction[int]):  # noqa: N801 - SQL function name
    type = Integer()
    inherit_cache = True


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: SQLCompiler, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


@compiles(least, "sqlite")
def _least_sqlite(element: least, compiler: SQLCompiler, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"


def clipped(start: Any, end: Any, lo: Any, hi: Any) -> ColumnElement[int]:
    """Seconds of [start, end) inside [lo, hi), never negative.

    Cast to a 32-bit integer (a clipped length is at most the window, far below 2**31 s) so
    PostgreSQL sums it in a bigint accumulator instead of numeric."""
    return cast(greatest(least(end, hi) - greatest(start, lo), 0), Integer)


def t(value: int) -> ColumnElement[int]:
    """A bound unix time as BIGINT (PostgreSQL would otherwise cast it to integer)."""
    return literal(value, BigInteger)
