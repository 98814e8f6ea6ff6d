"""stacks_1024_s: `sentinel stacks` over 1,024 ranks, end to end through the coordinator's API.

A real coordinator (a process of its own, SQLite); 128 simulated node agents with their own node
tokens long-poll it for commands, as agents do, and answer the `stacks.dump` with their 8 ranks'
synthesised stacks (`rank.stacks`, every thread, ~30 frames for the main thread). The ranks sit
in a few places: most wait in an all_reduce, a block of 16 in the data loader, 5 in backward,
and two odd ones (one saving a checkpoint, one in a frame of its own). Timed from the operator's
request to the grouped text printed: the request, the agents' answers, the ingest, the grouping
and the rendering. Also timed: grouping and rendering alone. Target (issue #22): <= 10 s, with the
odd ones out first. Last line of output: JSON.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.coordinator import _make_tokens
from sentinel.processes import free_port, stop_process, wait_ready
from sentinel.protocol import (
    EventBatch,
    EventKind,
    JobStatusPayload,
    RankStacksPayload,
    Source,
    StackFrame,
    ThreadStack,
    encode,
    make_event,
)
from sentinel.stacks.client import collect
from sentinel.stacks.group import group
from sentinel.stacks.render import render
from sentinel.status import Client

NODES, PER_NODE, JOB = 128, 8, "bench"
WORLD = NODES * PER_NODE
TARGET_S = 10.0
ODD = {WORLD - 1: "save_checkpoint", 517: "rare_branch"}  # rank: where it is


def _frames(leaf: list[str], depth: int = 30) -> list[StackFrame]:
    """A trainer's main thread: launcher and loop frames, then model frames, then `leaf`."""
    outer = ["<module>", "main", "run", "train", "train_step", "_call_impl", "forward"]
    model = [f"block_{i}_forward" for i in range(depth - len(outer) - len(leaf))]
    return [
        StackFrame(
            file=f"/opt/train/{'model' if f.startswith('block') else 'train'}.py",
            line=100 + i,
            func=f,
            code=f"x = {f}(x)",
        )
        for i, f in enumerate([*outer, *model, *leaf])
    ]


def _place(rank: int) -> list[str]:
    if rank in ODD:
        return [ODD[rank], "write", "flush"]
    if 256 <= rank < 272:
        return ["next_batch", "_next_data", "get", "wait"]
    if rank in (3, 99, 400, 801, 1000):
        return ["backward", "_engine_run_backward", "run_backward"]
    return ["all_reduce", "wrapper", "wait"]


def stacks_of(rank: int, request_id: str) -> RankStacksPayload:
    def thread(name: str, funcs: list[str]) -> ThreadStack:
        return ThreadStack(
            name=name,
            daemon=True,
            frames=[
                StackFrame(file="/opt/sentinel/trainer_hooks/x.py", line=10 + i, func=f)
                for i, f in enumerate(funcs)
            ],
        )

    return RankStacksPayload(
        request_id=request_id,
        pid=10_000 + rank,
        step=1234,
        threads=[
            ThreadStack(name="MainThread", frames=_frames(_place(rank))),
            thread("pin_memory", ["_bootstrap", "run", "_pin_memory_loop", "get", "wait"]),
            thread("sentinel-transport", ["_bootstrap", "run", "_run", "_dispatch", "capture"]),
            thread("sentinel-watchdog", ["_bootstrap", "run", "_run", "wait", "wait"]),
        ],
    )


async def agent(url: str, token: str, node: int, stop: asyncio.Event) -> None:
    """One node's agent: long-poll, answer a stacks.dump with its ranks' stacks, acknowledge."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(url, headers=headers) as s:
        while not stop.is_set():
            params = {"node": f"node-{node}", "wait": "5"}
            async with s.get("/v1/commands", params=params) as r:
                commands = (await r.json())["commands"]
            for cmd in commands:
                rid = cmd["args"]["request_id"]
                events = [
                    make_event(
                        EventKind.RANK_STACKS,
                        Source(node=f"node-{node}", rank=rank, job=JOB),
                        stacks_of(rank, rid),
                    )
                    for rank in range(node * PER_NODE, (node + 1) * PER_NODE)
                ]
                body = encode(EventBatch(events=events))
                ct = {"Content-Type": "application/json"}
                async with s.post("/v1/events", data=body, headers=ct) as r:
                    assert r.status == 200, await r.text()
                async with s.post(f"/v1/commands/{cmd['id']}/ack", json={"ok": True}) as r:
                    assert r.status == 200


def run_agents(url: str, tokens: list[str], ready: threading.Event, done: threading.Event) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(agent(url, t, i, stop)) for i, t in enumerate(tokens)]
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.1)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def register_job(url: str, admin: str) -> None:
    status = JobStatusPayload(
        state="running",
        generation=0,
        world_size=WORLD,
        gpus_per_node=PER_NODE,
        nodes=[f"node-{i}" for i in range(NODES)],
    )
    body = encode(EventBatch(events=[make_event(EventKind.JOB_STATUS, Source(job=JOB), status)]))
    req = urllib.request.Request(
        f"{url}/v1/events",
        data=body.encode(),
        method="POST",
        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).close()


def grouping_alone() -> tuple[float, float]:
    answers = [(r, stacks_of(r, "x")) for r in range(WORLD)]
    t0 = time.perf_counter()
    grouped = group(answers, WORLD)
    grouped_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    render({"job": JOB, "request": "x", **grouped.as_json()})
    return grouped_s, time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        admin, node_tokens = _make_tokens(state, None, NODES)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(tmp) / "coordinator.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sentinel",
                "coordinator",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(state),
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        ready, done = threading.Event(), threading.Event()
        agents = threading.Thread(target=run_agents, args=(url, node_tokens, ready, done))
        try:
            wait_ready(lambda: _up(url), proc, what="coordinator", log=log, timeout_s=60)
            register_job(url, admin)
            agents.start()
            ready.wait(30)
            time.sleep(2.0)  # every agent's long-poll is waiting, as on a quiet fleet
            t0 = time.perf_counter()
            doc = collect(Client(url, admin, timeout_s=30), JOB, wait_s=60)
            text = render(doc)
            end_to_end = time.perf_counter() - t0
        finally:
            done.set()
            agents.join(30)
            stop_process(proc, 10.0)
    grouped_s, render_s = grouping_alone()
    groups = [g["ranks_text"] for g in doc["groups"]]
    right = doc["answered"] == WORLD and groups[:2] == ["517", str(WORLD - 1)] and len(groups) == 5
    print(text.splitlines()[0])
    print(f"groups, odd ones out first: {groups}")
    print(
        json.dumps(
            {
                "stacks_1024_s": round(end_to_end, 3),
                "grouping_1024_s": round(grouped_s, 4),
                "render_1024_s": round(render_s, 4),
                "ranks": WORLD,
                "answered": doc["answered"],
                "groups": len(groups),
                "odd_ones_first": right,
                "target_s": TARGET_S,
            }
        )
    )
    sys.exit(0 if right and end_to_end <= TARGET_S else 1)


def _up(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/healthz", timeout=1).close()
    except OSError:
        return False
    return True


if __name__ == "__main__":
    main()
