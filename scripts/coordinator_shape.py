"""The coordinator's shape, measured: import cycles, imports that run back up the layers, the
largest file, and how often the walk of one ingested batch returns to a module it has left.

    python scripts/coordinator_shape.py [--json]

Imports are read from the source (every `import`, type-only and function-level ones included).
A cycle is a strongly connected set of two or more modules (or a module importing itself).
Layers, lowest first: `core` (the repair logic), then `store` and `backends` (what core's
interfaces are implemented by), then `runtime`, then `http`; a module directly under
`sentinel/coordinator` is above them all. An import from a lower layer of a higher one runs
back up. Modules of the layout before `core/` existed are placed by the job they did
(`OLD_LAYERS`), so the same rules measure both.

The batch walk hands one batch (a GPU's XID, which opens an incident and starts its run) to the
runtime's ingest (decode, group commit, answer) on a fresh SQLite store, records the
coordinator module of every call made until the answer, on the event loop's thread and the
store's, and counts the times the walk enters a module it had left before. Calls into the store
package (and what the store calls in turn, such as the constructors of the rows it returns) are
left out: each returns at once, and they say nothing of how the logic is cut.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sentinel" / "coordinator"
PREFIX = "sentinel.coordinator"
LAYERS = {"core": 0, "store": 1, "backends": 1, "runtime": 2, "http": 3}
TOP = 4  # modules directly under sentinel/coordinator
OLD_LAYERS = {
    "lifecycle": 0,
    "incidents": 0,
    "ingest": 0,
    "engine": 0,
    "effects": 0,
    "playbooks": 0,
    "actions": 0,
    "validation": 0,
    "stages": 0,
    "retention": 0,
    "auth": 0,
    "service": 2,
    "leadership": 2,
    "app": 3,
    "front": 3,
    "openapi": 3,
    "metrics": 3,
    "queries": 3,
    "stacks": 3,
    "fr_files": 3,
}
LINE_LIMIT = 400
STORE = PREFIX + ".store"  # the walk's floor: each call into the store returns at once


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The coordinator modules `path` imports (a name imported from a package that is itself
    a module counts as that module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith(PREFIX) and target != name:
                found.add(target)
    return found


def layer(name: str) -> int:
    parts = name.removeprefix(PREFIX + ".").split(".")
    if name == PREFIX:
        return TOP
    if parts[0] in LAYERS:
        return LAYERS[parts[0]]
    if parts[0] == "store":
        return 1
    return OLD_LAYERS.get(parts[0], TOP)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_shape() -> dict[str, Any]:
    known = modules()
    graph = {name: imports(path, name, known) for name, path in known.items()}
    back = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if layer(a) < layer(b))
    sizes = {name: len(path.read_text().splitlines()) for name, path in known.items()}
    largest = max(sizes, key=sizes.__getitem__)
    return {
        "modules": len(known),
        "cycles": cycles(graph),
        "back_edges": back,
        "largest_file": {"module": largest, "lines": sizes[largest]},
        "over_limit": sorted(n for n, s in sizes.items() if s > LINE_LIMIT),
    }


def batch_walk() -> dict[str, Any]:
    """The modules one XID batch passes through, from the group commit to its answer."""
    import asyncio

    sys.path.insert(0, str(ROOT / "tests"))
    from coord_util import cfg, job_status, xid

    from sentinel.protocol import EventBatch

    try:
        from sentinel.coordinator.runtime import Service
    except ImportError:  # the layout before runtime.py
        from sentinel.coordinator.service import Service  # type: ignore[no-redef]

    tmp = Path(tempfile.mkdtemp(prefix="sentinel-walk-"))
    fleet = EventBatch(events=[job_status("job1", ["node-1", "node-2"], ["spare-0"])])
    fault = EventBatch(events=[xid("node-1")])
    walk: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PREFIX) or _under_store(frame):
            return
        if not walk or walk[-1] != module:
            walk.append(module)

    async def run() -> None:
        service = Service(cfg(tmp))
        await service.start()
        allow = lambda _events: None  # noqa: E731 (an admin's batch: every event allowed)
        try:
            await service.ingest(fleet.model_dump_json().encode(), allow)
            # The engine's loop, which the batch wakes, runs on the same store thread: its own
            # calls (a token reload between ticks) would land in the batch's walk, as they did
            # in a loaded test run. The batch's walk is the ingest's alone.
            engine, service._engine_task = service._engine_task, None
            if engine is not None:
                engine.cancel()
                await asyncio.gather(engine, return_exceptions=True)
            # Both threads the batch runs on: the event loop's and the store's.
            await service.db(sys.setprofile, profile)
            sys.setprofile(profile)
            try:
                await service.ingest(fault.model_dump_json().encode(), allow)
            finally:
                sys.setprofile(None)
                await service.db(sys.setprofile, None)
        finally:
            await service.stop()

    asyncio.run(run())
    seen: set[str] = set()
    returns = 0
    for module in walk:
        returns += module in seen
        seen.add(module)
    return {"modules_entered": len(walk), "returns": returns, "walk": walk}


def _under_store(frame: Any) -> bool:
    """Whether the call is the store's, or made by it (turning its rows into records)."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(STORE):
            return True
        frame = frame.f_back
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="the figures as JSON only")
    args = ap.parse_args()
    shape = import_shape()
    walk = batch_walk()
    result = {
        "cycles": len(shape["cycles"]),
        "back_edges": len(shape["back_edges"]),
        "largest_file_lines": shape["largest_file"]["lines"],
        "batch_walk_returns": walk["returns"],
        "detail": {**shape, "batch_walk": walk},
    }
    if not args.json:
        print(json.dumps(result["detail"], indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "detail"}))


if __name__ == "__main__":
    main()
