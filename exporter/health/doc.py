"""Generates the tables of docs/health.md from the default tables (exporter/health/defaults.yaml).

``python -m gpuquota.exporter.health.doc --write docs/health.md`` rewrites the text between the
``<!-- health:... -->`` markers; ``--check`` exits non-zero when the file is out of date
(the test suite runs the check, so the docs cannot drift from the one table).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuquota.cli_common.generated import check, write
from gpuquota.exporter.health.config import default_catalog_actions, defaults


def catalog_actions() -> str:
    mapped = [
        f"`{bucket}` maps to {state.label} + `{action.label}`"
        for bucket, (state, action) in default_catalog_actions().items()
    ]
    return ", ".join(mapped) + "."


def xid_table() -> str:
    lines = [
        "| XID | Mnemonic | Meaning | State | Action | NVIDIA catalog | Why |",
        "|---:|---|---|---|---|---|---|",
    ]
    table = defaults()
    for xid in sorted(table.xid_rules):
        r = table.xid_rules[xid]
        lines.append(
            f"| {xid} | `{r.mnemonic}` | {r.description} | {r.state.label} | {r.action.label} "
            f"| {r.catalog} | {r.note} |"
        )
    u = table.unknown_xid
    lines.append(
        f"| any other | | not in the table | {u.state.label} | {u.action.label} | | configurable |"
    )
    return "\n".join(lines)


def condition_table() -> str:
    table = defaults()
    clock_bits = table.clock_event_bits()
    lines = ["| Reason | Meaning | State | Action | Kind |", "|---|---|---|---|---|"]
    for code, c in table.conditions.items():
        kind = (
            "event: clears after the quiet period" if c.edge else "level: clears when NVML says so"
        )
        bit = f" (clock event reason bit `{clock_bits[code]:#x}`)" if code in clock_bits else ""
        lines.append(
            f"| `{code}` | {c.description}{bit} | {c.state.label} | {c.action.label} | {kind} |"
        )
    lines.append("")
    lines.append(
        f"Default quiet period: {table.quiet_period_s:g} seconds (`--health-quiet-period`)."
    )
    return "\n".join(lines)


SECTIONS = {"buckets": catalog_actions, "xids": xid_table, "conditions": condition_table}


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        begin, end = f"<!-- health:{name} -->", f"<!-- /health:{name} -->"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"markers {begin} ... {end} are missing")
        block = f"{begin}\n{make()}\n{end}"
        text = pattern.sub(lambda _m: block, text)  # noqa: B023 (used at once)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="generate the tables of docs/health.md")
    parser.add_argument("path", type=Path, nargs="?", default=Path("docs/health.md"))
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the tables in place")
    mode.add_argument("--check", action="store_true", help="fail if the tables are out of date")
    args = parser.parse_args(argv)
    try:
        current = args.path.read_text()
        wanted = render(current)
    except (OSError, ValueError) as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return check(
            args.path,
            wanted,
            module="gpuquota.exporter.health.doc",
            source="exporter/health/defaults.yaml",
        )
    return write(args.path, wanted)


if __name__ == "__main__":
    raise SystemExit(main())
