"""The import graph: no module cycle anywhere, no loop between folders, and test modules that
share helpers through conftest or a helpers module, never by importing each other.

Read from the source with ``ast`` (nothing is imported), counting every import: those inside
functions and under ``if TYPE_CHECKING`` too, since a lazy import that breaks a cycle at run
time still ties the two modules together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpuquota", "exporter", "quota", "sim", "dashboards", "bench")
# gpuquota/<name> links to the top-level folder <name>/ (gpuquota/__init__.py)
LINKED = {p.name for p in (ROOT / "gpuquota").iterdir() if p.is_symlink()}
# Test folders whose test modules must not import each other (issue 8's loose ends).
TEST_FOLDERS = (
    "exporter",
    "health",
    "deviceplugin",
    "kubelet",
    "sim_nvml",
    "sim_cluster",
    "accounting",
    "controller",
    "store",
    "report",
    "common",
)
# What the accounting package (quota/accounting/: pure rules and in-memory state) must never
# import: SQL, the Kubernetes client, networking, files, processes, threads.
NOT_IN_ACCOUNTING = frozenset(
    {
        "sqlalchemy",
        "alembic",
        "psycopg",
        "sqlite3",
        "kubernetes",
        "urllib3",
        "urllib",
        "http",
        "socket",
        "ssl",
        "requests",
        "grpc",
        "prometheus_client",
        "subprocess",
        "os",
        "io",
        "pathlib",
        "shutil",
        "tempfile",
        "threading",
        "queue",
        "asyncio",
        "time",
    }
)

Graph = dict[str, set[str]]


def _modules(packages: Iterable[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[0] in LINKED:  # exporter/x.py is gpuquota.exporter.x
                parts.insert(0, "gpuquota")
            if parts[-1] == "__init__":
                parts.pop()
            if all(part.isidentifier() for part in parts):  # not e.g. gpu-node.dashboard.py
                found[".".join(parts)] = path
    return found


def _imported_names(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(modules: Mapping[str, Path]) -> Graph:
    """Module -> the project modules it imports (a name resolves to its longest module)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for module, path in modules.items():
        targets = {resolve(name) for name in _imported_names(module, path)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def folder_graph(graph: Mapping[str, set[str]], modules: Mapping[str, Path]) -> Graph:
    """Folder -> the folders its modules import, leaving out a folder's own ancestors and
    descendants (exporter/cli.py wires exporter/health/, which reads exporter/snapshot.py:
    layers of one folder, not a loop between two)."""

    def folder(module: str) -> str:
        return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]

    folders: Graph = {}
    for module, targets in graph.items():
        source = folder(module)
        edges = folders.setdefault(source, set())
        for target in map(folder, targets):
            related = source.startswith(target + ".") or target.startswith(source + ".")
            if target != source and not related:
                edges.add(target)
    return folders


def test_cycles_are_found() -> None:
    # The checker itself: a known loop and a known tree.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back() -> None:
    modules = _modules(PACKAGES)
    assert "gpuquota.exporter.snapshot" in modules and "gpuquota.exporter.health.engine" in modules
    assert cycles(import_graph(modules)) == []


def test_no_loop_between_folders() -> None:
    modules = _modules(PACKAGES)
    folders = folder_graph(import_graph(modules), modules)
    # the verdict's consumer
    assert "gpuquota.exporter.health" in folders["gpuquota.exporter.deviceplugin"]
    assert cycles(folders) == []


def test_test_modules_do_not_import_each_other() -> None:
    modules = _modules(f"tests/{folder}" for folder in TEST_FOLDERS)
    tests = {m for m in modules if m.rpartition(".")[2].startswith("test_")}
    graph = import_graph(modules)
    shared = {m: sorted(graph[m] & tests) for m in sorted(tests) if graph[m] & tests}
    assert shared == {}, "move the shared helpers to conftest.py or a helpers module"


def _top_level_imports(path: Path) -> set[str]:
    """Every absolute module name a file imports, any depth, relative ones left out."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def test_quota_side_has_no_cycle_between_modules_or_folders() -> None:
    modules = _modules(["quota"])
    graph = import_graph(modules)
    assert (
        "gpuquota.quota.accounting.accountant" in graph
        and "gpuquota.quota.controller.loop" in graph
    )
    assert cycles(graph) == []
    folders = folder_graph(graph, modules)
    assert cycles(folders) == []
    # one way: watch -> account -> store -> report; nothing downstream imports upstream
    assert "gpuquota.quota.controller" not in folders["gpuquota.quota.accounting"]
    assert "gpuquota.quota.store" not in folders["gpuquota.quota.accounting"]
    assert "gpuquota.quota.controller" not in folders["gpuquota.quota.store"]
    assert "gpuquota.quota.report" not in folders["gpuquota.quota.store"]


def test_accounting_imports_no_sql_kubernetes_or_io() -> None:
    modules = {
        m: p for m, p in _modules(["quota"]).items() if m.startswith("gpuquota.quota.accounting")
    }
    assert (
        "gpuquota.quota.accounting.trackers.pods" in modules
        and "gpuquota.quota.accounting.rules.ends" in modules
    )
    found = {}
    for module, path in sorted(modules.items()):
        names = _top_level_imports(path)
        bad = sorted(n for n in names if n.split(".")[0] in NOT_IN_ACCOUNTING)
        # within the project, accounting reads only itself
        bad += sorted(
            n
            for n in names
            if n.split(".")[0] in PACKAGES and not n.startswith("gpuquota.quota.accounting")
        )
        if module.startswith("gpuquota.quota.accounting.rules"):
            bad += sorted(n for n in names if n == "logging")  # pure rules do not even log
        if bad:
            found[module] = bad
    assert found == {}


def test_the_accounting_check_can_fail() -> None:
    # the checker sees an SQL import where there is one
    assert "sqlalchemy" in _top_level_imports(ROOT / "quota" / "store" / "db.py")


def _imports_of(prefix: str) -> dict[str, set[str]]:
    """Every absolute import of each module under ``prefix`` (a dotted package name)."""
    return {
        module: _top_level_imports(path)
        for module, path in _modules(PACKAGES).items()
        if module == prefix or module.startswith(prefix + ".")
    }


def _reaching(imports: dict[str, set[str]], forbidden: str) -> dict[str, list[str]]:
    return {
        module: sorted(n for n in names if n == forbidden or n.startswith(forbidden + "."))
        for module, names in sorted(imports.items())
        if any(n == forbidden or n.startswith(forbidden + ".") for n in names)
    }


def test_exporter_imports_nothing_from_quota() -> None:
    # one Kubernetes corner (gpuquota/kube/): the node agent never loads the controller's code
    exporter = _imports_of("gpuquota.exporter")
    assert "gpuquota.exporter.enrich.slicewatcher" in exporter
    assert _reaching(exporter, "gpuquota.quota") == {}


def test_the_kube_corner_imports_neither_program() -> None:
    kube = _imports_of("gpuquota.kube")
    assert {"gpuquota.kube.watch", "gpuquota.kube.client"} <= kube.keys()
    assert _reaching(kube, "gpuquota.quota") == {}
    assert _reaching(kube, "gpuquota.exporter") == {}


def test_the_program_checks_can_fail() -> None:
    # the checker sees the controller's imports of the accounting where they are
    quota = _imports_of("gpuquota.quota.controller")
    assert _reaching(quota, "gpuquota.quota.accounting")


# --- the node agent: collect -> enrich -> expose (issue 20) -------------------------------------

EXPORTER = "gpuquota.exporter"
# The exporter's pure rules: no threads, sockets, files, clocks or processes.
PURE_EXPORTER_MODULES = (
    "collect.tiers",
    "collect.schedule",
    "collect.units",
    "enrich.admin_access",
    "enrich.cgroup",
    "enrich.podnames",
    "enrich.pods",
    "enrich.usage",
    "enrich.ledger",
)


def _exporter_graph() -> Graph:
    return import_graph(_modules(["exporter"]))


def _importers(graph: Mapping[str, set[str]], source: str, target: str) -> dict[str, list[str]]:
    """Modules under `source` that import something under `target`, and what."""
    under = lambda m, p: m == p or m.startswith(p + ".")  # noqa: E731
    return {
        m: sorted(t for t in targets if under(t, target))
        for m, targets in sorted(graph.items())
        if under(m, source) and any(under(t, target) for t in targets)
    }


def test_collect_imports_neither_enrich_nor_expose() -> None:
    graph = _exporter_graph()
    assert f"{EXPORTER}.collect.loop" in graph and f"{EXPORTER}.expose.server" in graph
    for later in ("enrich", "expose", "health", "dra", "deviceplugin", "nodestatus"):
        assert _importers(graph, f"{EXPORTER}.collect", f"{EXPORTER}.{later}") == {}, later
    # the checker sees the arrows that do exist
    assert _importers(graph, f"{EXPORTER}.expose", f"{EXPORTER}.collect")


def test_enrich_does_not_import_expose_and_the_server_only_transports() -> None:
    graph = _exporter_graph()
    assert _importers(graph, f"{EXPORTER}.enrich", f"{EXPORTER}.expose") == {}
    assert _importers(graph, f"{EXPORTER}.enrich", f"{EXPORTER}.dra") == {}  # dra/ imports enrich/
    server = graph[f"{EXPORTER}.expose.server"]
    assert not {m for m in server if m.startswith(f"{EXPORTER}.collect")}
    assert f"{EXPORTER}.expose.scrape" in server


def test_only_collect_nvml_names_pynvml() -> None:
    users = {
        module
        for module, path in _modules(["exporter"]).items()
        if any(n.split(".")[0] == "pynvml" for n in _top_level_imports(path))
    }
    assert users == {f"{EXPORTER}.collect.nvml"}


def test_the_exporters_pure_rules_do_no_io() -> None:
    modules = _modules(["exporter"])
    found = {}
    for name in PURE_EXPORTER_MODULES:
        imported = _top_level_imports(modules[f"{EXPORTER}.{name}"])
        bad = sorted(n for n in imported if n.split(".")[0] in NOT_IN_ACCOUNTING | {"logging"})
        if bad:
            found[name] = bad
    assert found == {}


# The verdict's publishers (issue 20, phase 2): consumers of the health verdict, each beside
# the others, none a step of collect -> enrich -> expose.
PUBLISHERS = ("deviceplugin", "nodestatus", "dra", "health.route", "listener_thread")
# health/'s own core: the rules, the state machine, its thread, the board, the values
HEALTH_CORE = ("verdict", "table", "config", "engine", "checker", "board", "publishing", "view")


def test_enrich_and_expose_never_import_a_publisher() -> None:
    graph = _exporter_graph()
    assert f"{EXPORTER}.deviceplugin.manager" in graph and f"{EXPORTER}.dra.taints" in graph
    for step in ("enrich", "expose"):
        for publisher in PUBLISHERS:
            found = _importers(graph, f"{EXPORTER}.{step}", f"{EXPORTER}.{publisher}")
            assert found == {}, (step, publisher)
    # what expose/ does read beside the snapshot: the verdict and the publishers' own state
    assert _importers(graph, f"{EXPORTER}.expose", f"{EXPORTER}.health.verdict")
    assert _importers(graph, f"{EXPORTER}.expose", f"{EXPORTER}.health.publishing")


def test_publishers_read_the_verdict_never_collect() -> None:
    graph = _exporter_graph()
    for publisher in PUBLISHERS:
        assert _importers(graph, f"{EXPORTER}.{publisher}", f"{EXPORTER}.collect") == {}, publisher
        # a publisher is handed the verdict (board or listener): it never drives the checker
        checker = _importers(graph, f"{EXPORTER}.{publisher}", f"{EXPORTER}.health.checker")
        assert checker == {}, publisher
    # the checker sees the arrows that do exist: the device plugin reads the board
    assert _importers(graph, f"{EXPORTER}.deviceplugin", f"{EXPORTER}.health.board")


def test_health_core_imports_no_publisher_and_only_app_wires_them() -> None:
    graph = _exporter_graph()
    for module in HEALTH_CORE:
        for publisher in PUBLISHERS:
            found = _importers(graph, f"{EXPORTER}.health.{module}", f"{EXPORTER}.{publisher}")
            assert found == {}, (module, publisher)
    # the one place the checker and its publishers meet
    wiring = {
        m
        for m, targets in graph.items()
        if f"{EXPORTER}.health.checker" in targets
        and any(t.startswith(f"{EXPORTER}.{p}") for p in PUBLISHERS for t in targets)
    }
    assert wiring == {f"{EXPORTER}.app"}
