"""Reading flight-recorder dumps without torch, and without trusting them.

A dump is the pickle PyTorch's `_dump_fr_trace` writes (NCCL or gloo, format versions 2.x):
`{"version", "pg_config", "pg_status", "entries": [...], ...}`. Pickle can run code, so dumps
are read by an unpickler that refuses every global: only the builtin containers and scalars the
format uses come back. Each dump is boiled down at once to a `RankSummary` — per process group,
the last sequence number the rank issued and the signatures of the collectives still in its
ring buffer — which is all the analysis needs and keeps 16k-rank directories in memory.

Files: `<prefix><rank>` for dumps (PyTorch's naming; the prefix is inferred), and the optional
Sentinel sidecars `sentinel_fr_meta.<rank>.json` with process-group membership.
"""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import re
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIDECAR_RE = re.compile(r"^sentinel_fr_meta\.(\d+)\.json$")


def dumped_ranks(names: Iterable[str]) -> set[int]:
    """The ranks whose dump is complete among these file names: a rank's sidecar is written
    after its dump (trainer_hooks.flight), so a sidecar means the dump beside it is whole."""
    return {int(m.group(1)) for n in names if (m := SIDECAR_RE.match(n))}


DUMP_RE = re.compile(r"^(?P<prefix>[A-Za-z0-9_.\-]*?)(?P<rank>\d+)$")

# op, input sizes, input dtypes of one collective entry (sizes and dtypes as their repr)
Signature = tuple[str, str, str]


class DumpError(ValueError):
    """The directory or a file in it cannot be read as flight-recorder dumps."""


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing global {module}.{name} in a flight-recorder dump")


def safe_loads(data: bytes) -> Any:
    return _NoGlobals(io.BytesIO(data)).load()


@dataclass
class GroupState:
    desc: str = ""
    seq: int | None = None  # last collective sequence number this rank issued in the group
    ops: dict[int, list[Signature]] = field(default_factory=dict)  # seq -> entries in buffer
    created_ns: dict[int, int] = field(default_factory=dict)  # seq -> when it was issued
    # Last collective this rank saw complete in the group; None when the dump cannot say
    # (gloo records no completion).
    completed: int | None = None


@dataclass
class RankSummary:
    rank: int
    version: str
    groups: dict[str, GroupState]
    pg_config: dict[str, str]  # group name -> key into `configs`
    configs: dict[str, list[int]]  # member lists this process had not seen before
    entries: int
    wrapped: bool  # the ring buffer has overwritten older entries


# Every rank's dump repeats the member lists (the world group's has every rank in it): parse
# and ship each distinct list once per process instead of once per rank. Keys are only
# compared with keys made by the same process, so a per-process string hash is enough.
_seen_configs: set[str] = set()


@dataclass
class DumpDir:
    summaries: dict[int, RankSummary]
    sidecars: dict[int, dict[str, Any]]
    unreadable: dict[int, str]
    prefix: str


def _ranks_of(raw: Any) -> list[int]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            try:
                raw = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                return []
    if isinstance(raw, list | tuple):
        return sorted(int(r) for r in raw if isinstance(r, int))
    return []


def summarize(dump: Any, rank: int, since_ns: int | None = None) -> RankSummary:
    """`since_ns`: entries created before it are an earlier generation's of a warm rank
    process (its sidecar says when its generation began) and are left out."""
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise DumpError("not a flight-recorder dump (expected a dict with an 'entries' list)")
    if since_ns is not None:
        dump = {**dump, "entries": [e for e in dump["entries"] if _created(e) >= since_ns]}
    groups: dict[str, GroupState] = {}
    id_to_name: dict[str, str] = {}
    first_record: int | None = None
    for e in dump.get("entries", []):  # the hot loop of a 16k-rank analysis: keep it plain
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group") or ("", "")
        name = str(pg[0])
        g = groups.get(name)
        if g is None:
            g = groups[name] = GroupState(desc=str(pg[1]) if len(pg) > 1 else "")
        pg_id = e.get("pg_id", name)
        if pg_id not in id_to_name:
            id_to_name[pg_id] = name
        seq = int(e.get("collective_seq_id", 0))
        sig = (
            str(e.get("profiling_name", "")),
            repr(e.get("input_sizes")),
            repr(e.get("input_dtypes")),
        )
        ops = g.ops.get(seq)
        if ops is None:
            g.ops[seq] = [sig]
            created = e.get("time_created_ns")
            if isinstance(created, int):
                g.created_ns[seq] = created
        else:
            ops.append(sig)
        if g.seq is None or seq > g.seq:
            g.seq = seq
        if e.get("state") == "completed" and (g.completed is None or seq > g.completed):
            g.completed = seq
        if first_record is None and isinstance(e.get("record_id"), int):
            first_record = e["record_id"]  # entries come oldest first
    id_to_name = {str(k): v for k, v in id_to_name.items()}
    # pg_status survives ring-buffer wrap-around; it is keyed by the rank-local pg id.
    for pg_id, status in (dump.get("pg_status") or {}).items():
        group_name = id_to_name.get(str(pg_id))
        if group_name is None or not isinstance(status, dict):
            continue
        g = groups[group_name]
        enq = status.get("last_enqueued_collective")
        if isinstance(enq, int) and enq >= 0:
            g.seq = enq if g.seq is None else max(g.seq, enq)
        done = status.get("last_completed_collective")
        if isinstance(done, int) and done >= 0:
            g.completed = done if g.completed is None else max(g.completed, done)
    pg_config: dict[str, str] = {}
    configs: dict[str, list[int]] = {}
    for name, cfg in (dump.get("pg_config") or {}).items():
        raw = cfg.get("ranks") if isinstance(cfg, dict) else None
        if not name or not isinstance(raw, str | list):
            continue
        text = raw if isinstance(raw, str) else repr(raw)
        key = f"{len(text)}:{hash(text)}"  # a key within this run, not a stable digest
        if key not in _seen_configs:
            ranks = _ranks_of(raw)
            if not ranks:
                continue
            _seen_configs.add(key)
            configs[key] = ranks
        pg_config[str(name)] = key
    return RankSummary(
        rank=rank,
        version=str(dump.get("version", "")),
        groups=groups,
        pg_config=pg_config,
        configs=configs,
        entries=len(dump.get("entries", [])),
        wrapped=first_record is not None and first_record > 0,
    )


def _created(entry: Any) -> int:
    created = entry.get("time_created_ns") if isinstance(entry, dict) else None
    return created if isinstance(created, int) else 0


def _load_one(job: tuple[str, int, int | None]) -> RankSummary | str:
    path, rank, since_ns = job
    try:
        return summarize(safe_loads(Path(path).read_bytes()), rank, since_ns)
    except (OSError, pickle.UnpicklingError, DumpError, EOFError, ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"


def _infer_prefix(names: list[str]) -> str:
    prefixes = Counter(m["prefix"] for n in names if (m := DUMP_RE.match(n)))
    if not prefixes:
        raise DumpError("no flight-recorder dumps (files named <prefix><rank>) found")
    return prefixes.most_common(1)[0][0]


def load_dir(path: str | Path, prefix: str | None = None, workers: int | None = None) -> DumpDir:
    root = Path(path)
    if not root.is_dir():
        raise DumpError("not a directory")
    names = [n for n in os.listdir(root) if not n.startswith(".")]
    sidecars: dict[int, dict[str, Any]] = {}
    for n in names:
        if m := SIDECAR_RE.match(n):
            try:
                sidecars[int(m[1])] = json.loads((root / n).read_text())
            except (OSError, ValueError):
                continue
    candidates = [n for n in names if DUMP_RE.match(n) and not SIDECAR_RE.match(n)]
    prefix = _infer_prefix(candidates) if prefix is None else prefix
    ranks = [
        (n, int(n[len(prefix) :]))
        for n in candidates
        if n.startswith(prefix) and n[len(prefix) :].isdigit()
    ]
    if not ranks:
        raise DumpError(f"no dumps named {prefix}<rank>")
    jobs = [(str(root / n), r, _since(sidecars.get(r))) for n, r in ranks]
    _seen_configs.clear()
    results = _load_all(jobs, workers)
    summaries = {
        r: s for (_, r, _), s in zip(jobs, results, strict=True) if isinstance(s, RankSummary)
    }
    unreadable = {r: s for (_, r, _), s in zip(jobs, results, strict=True) if isinstance(s, str)}
    return DumpDir(summaries, sidecars, unreadable, prefix)


def _since(sidecar: dict[str, Any] | None) -> int | None:
    since = sidecar.get("since_ns") if isinstance(sidecar, dict) else None
    return since if isinstance(since, int) and not isinstance(since, bool) else None


def _load_all(
    jobs: list[tuple[str, int, int | None]], workers: int | None
) -> list[RankSummary | str]:
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    if workers <= 1 or len(jobs) < 512:
        return [_load_one(j) for j in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_load_one, jobs, chunksize=256))
