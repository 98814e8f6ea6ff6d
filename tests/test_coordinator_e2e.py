"""Real processes: `sentinel coordinator`, `sentinel run` with a small training script, kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from coord_util import ROOT, SENTINEL, Coordinator, job_status, wait_for, xid

from sentinel.protocol import EventBatch, encode


def test_supervised_job_survives_a_rank_crash_and_a_gpu_failure(
    coord: Coordinator, tmp_path: Path
) -> None:
    """Default playbooks rank_crash and gpu_hardware_fault, end to end on a real gang."""
    admin = (coord.state / "admin.token").read_text().strip()
    job_tok, node_tok = (
        coord.token("--role", "job", "--job", "job1"),
        coord.token("--role", "node", "--node", "node-1"),
    )
    (tmp_path / "job.token").write_text(job_tok)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    sup = subprocess.Popen(
        [
            *SENTINEL,
            "run",
            "--job-id",
            "job1",
            "--coordinator",
            coord.url,
            "--token-file",
            str(tmp_path / "job.token"),
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--spares",
            "1",
            "--checkpoint-dir",
            str(ckpt),
            "--log-dir",
            str(tmp_path / "logs"),
            "--rank-socket-template",
            "/run/sentinel/{node}.sock",
            "--",
            sys.executable,
            str(ROOT / "tests/helpers/toy_trainer.py"),
            "--steps",
            "60",
            "--ckpt-dir",
            str(ckpt),
            "--out",
            str(out),
            "--step-s",
            "0.05",
        ],
        env={**os.environ, "TOY_CRASH": "1:12:0"},
        stderr=open(tmp_path / "sup.log", "wb"),  # noqa: SIM115
    )
    try:

        def generation() -> int:
            jobs = coord.call("GET", "/v1/jobs", admin)
            assert isinstance(jobs, list)
            return int(jobs[0]["generation"]) if jobs and jobs[0]["state"] == "running" else -1

        wait_for(lambda: generation() == 1, what="restart after the rank crash")
        wait_for((out / "g1-rank0.json").exists, what="generation 1 training")
        batch = encode(EventBatch(events=[xid("node-1", gpu=1, code=79)]))
        coord.call("POST", "/v1/events", node_tok, batch.encode())
        assert sup.wait(60) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
    incidents = coord.call("GET", "/v1/incidents", admin)
    assert [(i["playbook"], i["state"]) for i in incidents] == [  # type: ignore[union-attr]
        ("rank_crash", "mitigated"),
        ("gpu_hardware_fault", "mitigated"),
    ]
    g1 = json.loads((out / "g1-rank0.json").read_text())
    assert g1["resume_from"].endswith(f"step_{g1['start']}.json") and g1["start"] >= 10
    last = json.loads((out / "g2-rank3.json").read_text())
    assert last["node"] == "spare-0" and last["end"] == 60
    assert last["socket"] == "/run/sentinel/spare-0.sock"  # that node's agent
    assert last["resume_from"] and last["start"] >= g1["start"] and last["world"] == 4
    assert (coord.state / "exclude.txt").read_text().split() == ["node-1"]
    audit = coord.call("GET", "/v1/audit?limit=1000", admin)
    whats = [a["what"] for a in audit]  # type: ignore[union-attr]
    for what in (
        "action.evict_node",
        "action.swap_spare",
        "action.rollback",
        "action.resume",
        "command.ack",
        "run.done",
    ):
        assert what in whats
    assert whats.count("action.evict_node") == 1
    job = coord.call("GET", "/v1/jobs", admin)[0]  # type: ignore[index]
    assert job["state"] == "finished" and job["generation"] == 2


def test_kill_9_loses_no_acknowledged_event_and_repeats_no_action(
    coord_on_each_store: Coordinator,
) -> None:
    """On either store: kill -9 while the engine works through a DBE storm under ingest load;
    restarted, the coordinator loses no acknowledged event and repeats no action. (On
    PostgreSQL the restarted process leads once the dead one's lease has run out.)"""
    coord = coord_on_each_store
    admin = (coord.state / "admin.token").read_text().strip()
    fleet = [f"node-{i}" for i in range(8)]
    # a job with no supervisor: the hardware playbook evicts node-5, then waits in `resume`.
    # Spares for every node the storm below strikes: the eviction budget is what must bind.
    spares = [f"spare-{i}" for i in range(5)]
    coord.call(
        "POST",
        "/v1/events",
        admin,
        encode(EventBatch(events=[job_status("jobk", fleet, spares), xid("node-5")])).encode(),
    )
    acked: list[str] = []
    stop = threading.Event()

    def load() -> None:
        n = 0
        while not stop.is_set():
            # XID 43 (a channel reset) asks for nothing in the catalog: ingest load, no incident
            events = [xid(f"load-{n % 64}", code=43, id=f"ev-{n}-{k}") for k in range(20)]
            n += 1
            try:
                coord.call("POST", "/v1/events", admin, encode(EventBatch(events=events)).encode())
            except (urllib.error.URLError, ConnectionError, OSError):
                continue
            acked.extend(e.id for e in events)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) > 400, what="load")
    with coord.db() as db:
        wait_for(
            lambda: (
                db.execute("SELECT COUNT(*) FROM commands WHERE kind = 'job.restart'").fetchone()[0]
                == 1
            ),
            what="resume step",
        )
    # a DBE storm on four more nodes; kill -9 while the engine works through it
    storm = EventBatch(events=[xid(f"node-{i}") for i in range(4)])
    coord.call("POST", "/v1/events", admin, encode(storm).encode())
    time.sleep(0.15)
    assert coord.proc is not None
    coord.proc.send_signal(signal.SIGKILL)
    coord.proc.wait()
    stop.set()
    for t in threads:
        t.join()
    coord.start()  # same state dir
    with coord.db() as db:

        def settled() -> bool:
            live = "SELECT COUNT(*) FROM runs WHERE status IN ('pending', 'running')"
            # a drain recorded but not yet answered leaves its run waiting and the node draining
            draining = "SELECT COUNT(*) FROM effects WHERE state = 'intended'"
            # ...and a drain just answered finishes its step on the engine's next pass
            evicting = (
                "SELECT COUNT(*) FROM actions WHERE action = 'evict_node' AND state = 'started'"
            )
            return all(db.execute(q).fetchone()[0] == 0 for q in (live, draining, evicting))

        wait_for(settled, 20, "runs to continue after the restart")
        stored = {r[0] for r in db.execute("SELECT id FROM events")}
        missing = [i for i in acked if i not in stored]
        assert not missing, f"{len(missing)} acknowledged events lost"
        repeated = (
            "SELECT incident_id FROM commands WHERE kind = 'job.restart'"
            " GROUP BY incident_id HAVING COUNT(*) > 1"
        )
        assert db.execute(repeated).fetchall() == []
        evicted = sorted(r[0] for r in db.execute("SELECT name FROM nodes WHERE state='evicted'"))
        audited = "SELECT COUNT(*) FROM audit WHERE what='action.evict_node' AND why LIKE 'done:%'"
        assert db.execute(audited).fetchone()[0] == len(evicted) == 4  # the budget, once each
        runs = db.execute("SELECT status, step_index FROM runs ORDER BY id").fetchall()
        assert tuple(runs[0]) == ("waiting", 4)  # continued where it stopped: still in `resume`
        assert sorted(r[0] for r in runs) == ["escalated"] + ["waiting"] * 4
        # the supervisor never came: its job is visibly lost
        wait_for(
            lambda: db.execute("SELECT state FROM jobs").fetchone()[0] == "lost", 10, "job lost"
        )
    exclude = (coord.state / "exclude.txt").read_text().split()
    assert sorted(exclude) == evicted and "node-5" in exclude
