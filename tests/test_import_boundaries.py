"""What a training process may take from `sentinel`, read from the source.

The in-trainer library (`trainer_hooks`) imports the wire protocol and nothing else of
`sentinel`: no aiohttp, no pynvml in a training process. The reference trainer
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
LIBRARY = {"sentinel.protocol", "sentinel.ranks.current"}
REFERENCE = LIBRARY | {
    "sentinel.processes",
    "sentinel.scenario",
    "sentinel.exitcodes",
    "sentinel.lighthouse",
}


def _sentinel_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n == "sentinel" or n.startswith("sentinel.")}
    return found


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
