"""What a training process may take from `sentinel`, read from the source.

The in-trainer library (`trainer_hooks`) imports the wire protocol and the fault catalog (which
depends on the protocol only; the straggler thresholds are its) and nothing else of `sentinel`:
no aiohttp, no pynvml in a training process. The reference trainer
(`trainer_hooks/reference/`) may also use the scenario file's models, the exit codes, and the
process helpers its launcher shares with the supervisor and the simulated fleet
(`sentinel.processes`), which is why that module is standard library only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "sentinel" / "coordinator" / "core"
# The repair core takes a store and a clock: no web server, no threads, no driver, no shell.
CORE_FORBIDS = (
    "aiohttp",
    "httptools",
    "uvloop",
    "asyncio",
    "threading",
    "concurrent",
    "multiprocessing",
    "sqlite3",
    "psycopg",
    "sqlalchemy",
    "sentinel.coordinator.store",
    "sentinel.coordinator.http",
    "sentinel.coordinator.backends",
    "sentinel.coordinator.runtime",
)
# The daemons, and the lab (drills, simulation, test clusters, modelling) that none of them may
# load, however indirectly.
DAEMONS = ("agent", "coordinator", "supervisor", "ranks")
LAB = "sentinel.lab"
LIBRARY = {
    "sentinel.protocol",
    "sentinel.ranks.current",
    "sentinel.faults.catalog",
    "sentinel.beacon",
}
REFERENCE = LIBRARY | {
    "sentinel.processes",
    "sentinel.scenario",
    "sentinel.exitcodes",
    "sentinel.lighthouse",
}


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, wherever the import stands (type-only ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _sentinel_imports(path: Path) -> set[str]:
    return {n for n in _imports(path) if n == "sentinel" or n.startswith("sentinel.")}


def test_trainer_hooks_take_only_the_allowed_sentinel_modules() -> None:
    wrong = {}
    for path in sorted((ROOT / "trainer_hooks").rglob("*.py")):
        allowed = REFERENCE if "reference" in path.relative_to(ROOT).parts else LIBRARY
        extra = _sentinel_imports(path) - allowed
        if extra:
            wrong[str(path.relative_to(ROOT))] = sorted(extra)
    assert wrong == {}


def test_the_process_helpers_need_only_the_standard_library() -> None:
    code = (
        "import json, sys; before = set(sys.modules); import sentinel.processes; "
        "print(json.dumps(sorted(m.split('.')[0] for m in set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout)) - {"sentinel"}
    assert loaded <= set(sys.stdlib_module_names), loaded - set(sys.stdlib_module_names)


def test_the_boundary_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom sentinel.coordinator import app\nimport sentinel.agent\n")
    assert _sentinel_imports(bad) - LIBRARY == {"sentinel.coordinator", "sentinel.agent"}


def test_the_repair_core_imports_no_server_thread_driver_or_shell() -> None:
    wrong = {}
    for path in sorted(CORE.rglob("*.py")):
        bad = {n for n in _imports(path) for f in CORE_FORBIDS if n == f or n.startswith(f + ".")}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert wrong == {}


def test_the_repair_core_reads_the_time_only_from_the_clock_it_is_given() -> None:
    """No `time.time()` (nor `from time import time`) in the core: it is handed `now`."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            wall = isinstance(node, ast.Attribute) and node.attr == "time"
            wall = wall and isinstance(node.value, ast.Name) and node.value.id == "time"
            named = isinstance(node, ast.ImportFrom) and node.module == "time"
            if wall or named:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_importing_the_repair_core_loads_no_web_server_or_driver() -> None:
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in CORE.rglob("*.py")
    )
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('aiohttp', 'psycopg', 'sqlalchemy', 'sqlite3', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _reaches(path: Path) -> dict[str, str]:
    """Every `sentinel` module `path` loads, directly or through others (imports anywhere in
    a module, type-only ones too), each with the module that imports it."""
    found: dict[str, str] = {}
    todo = [path]
    while todo:
        current = todo.pop()
        tree = ast.parse(current.read_text())
        names = set(_sentinel_imports(current))
        for node in ast.walk(tree):  # `from sentinel.x import y`: y may be a module itself
            if isinstance(node, ast.ImportFrom) and node.module and node.module in names:
                names |= {f"{node.module}.{a.name}" for a in node.names}
        for name in sorted(names):
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # a package's __init__ loads with its module
                prefix = ".".join(parts[:i])
                file = _module_file(prefix)
                if file is not None and prefix not in found:
                    found[prefix] = str(current.relative_to(ROOT))
                    todo.append(file)
    return found


def test_no_daemon_loads_the_lab() -> None:
    wrong = {}
    for daemon in DAEMONS:
        for path in sorted((ROOT / "sentinel" / daemon).rglob("*.py")):
            lab = {m: by for m, by in _reaches(path).items() if m.startswith(LAB)}
            if lab:
                wrong[str(path.relative_to(ROOT))] = lab
    assert wrong == {}


def test_the_lab_check_follows_imports_through_other_modules() -> None:
    reached = _reaches(ROOT / "sentinel" / "commands" / "demo_cmd.py")
    assert any(m.startswith(LAB) for m in reached)
