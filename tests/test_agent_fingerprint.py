"""The node's configuration fingerprint: what the NVML backend reads from the fake libnvidia-ml,
the `agent.fingerprint` events a real agent process sends a stand-in coordinator (at start, and
again when a field changed), and the job's runtime read by the probe with the site's
environment file, or left out when the probe fails (sentinel/agent/fingerprint.py)."""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_nvml import (
    NOT_SUPPORTED,
    UNKNOWN,
    BackendProcess,
    FakeGpu,
    build_library,
    expected_fingerprint,
    write_config,
)
from fake_nvml.agent import FakeNvmlAgent, wait_until
from test_agent_service import StandInCoordinator
from test_nvml_backend import OLDEST_PYNVML

from sentinel.agent.fingerprint import (
    FingerprintReporter,
    ProbeFailed,
    probe_runtime,
    read_env_file,
)
from sentinel.fingerprint import drift
from sentinel.processes import free_port
from sentinel.protocol import AgentFingerprintEvent, Event, Source

KERNEL = {"kernel": platform.release()}
SECRET = "hunter2-do-not-log"
ENV_FILE = f"""# the site's rank environment
NCCL_IB_HCA=mlx5_0,mlx5_1
export FI_PROVIDER="efa"
NCCL_SOCKET_IFNAME = 'eth0'
WANDB_API_KEY={SECRET}
not a line
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def backend(lib: Path, tmp_path: Path) -> Iterator[Callable[..., BackendProcess]]:
    procs: list[BackendProcess] = []

    def start(pynvml_dir: Path | None = None) -> BackendProcess:
        proc = BackendProcess(
            lib, tmp_path / "fake-nvml.conf", tmp_path / "backend.log", pynvml_dir
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.close()


@pytest.fixture
def coordinator() -> Iterator[StandInCoordinator]:
    c = StandInCoordinator(free_port())
    c.start()
    yield c
    c.stop()


def script(path: Path, body: str) -> str:
    """An executable stand-in for the job's interpreter."""
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def prints(coordinator: StandInCoordinator) -> list[dict[str, str]]:
    return [e.payload.fields for e in coordinator.received if isinstance(e, AgentFingerprintEvent)]


def reporting_agent(
    tmp_path: Path, lib: Path, gpus: list[FakeGpu], url: str, config: str = ""
) -> FakeNvmlAgent:
    token = tmp_path / "node.token"
    token.write_text("node-token\n")  # the stand-in coordinator takes any
    return FakeNvmlAgent(
        tmp_path,
        lib,
        gpus,
        env={"SENTINEL_AGENT__TOKEN_FILE": str(token), "NCCL_DEBUG": "INFO"},  # the agent's own
        args=["--coordinator", url, "--kmsg", "off"],
        config="agent:\n" + (config or "  fingerprint_every_s: 3600\n"),
    )


# --- the NVML backend ------------------------------------------------------------------------


@pytest.mark.parametrize("oldest", [False, True], ids=["pynvml", "oldest-pynvml"])
def test_the_backend_reports_what_the_library_serves(
    backend: Callable[..., BackendProcess], tmp_path: Path, oldest: bool
) -> None:
    """Every field, one GPU set apart (another VBIOS, persistence off, ECC to be turned off at
    the next reset), and the system's versions; on the oldest pynvml the agent allows too."""
    gpus = [FakeGpu(index=0), FakeGpu(index=1, vbios="96.00.A5.00.02", persistence_mode=0)]
    gpus[1].ecc_mode_pending = 0
    config = tmp_path / "fake-nvml.conf"
    write_config(config, gpus, driver_version="550.54.15", cuda_driver_version=12040)
    got = backend(OLDEST_PYNVML if oldest else None).ask("fingerprint")["fingerprint"]
    assert got == expected_fingerprint(gpus, "550.54.15", 12040)
    assert got["cuda_driver"] == "12.4" and got["gpu.1.ecc_pending"] == "off"
    assert "gpu.0.ecc_pending" not in got  # only while a change waits
    assert got["gpu.0.persistence"] == "on" and got["gpu.1.persistence"] == "off"


CLUSTER = "3c5b9a01-77e2-4f0d-a8c1-5d2e6f7a8b9c"


@pytest.mark.parametrize(
    "oldest, old_driver",
    [(False, False), (True, False), (False, True)],
    ids=["pynvml", "oldest-pynvml", "old-driver"],
)
def test_the_nodes_nvlink_domain_is_read_from_its_fabric_and_never_judged_as_drift(
    lib: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    oldest: bool,
    old_driver: bool,
) -> None:
    """An NVL72-like node: its GPUs' fabric cluster and clique, once the fabric manager has
    registered them, are the node's `nvlink_domain` (through the versioned call, or the first
    one where this pynvml or driver lacks it). A GPU on no fabric, or not registered, adds
    none; and nodes of two domains are not drift."""
    gpus = [FakeGpu(index=i, fabric_cluster=CLUSTER, fabric_clique=7) for i in range(2)]
    config = tmp_path / "fake-nvml.conf"
    write_config(config, gpus)
    library = build_library(tmp_path_factory.mktemp("old"), old_driver=True) if old_driver else lib
    proc = BackendProcess(
        library, config, tmp_path / "backend.log", OLDEST_PYNVML if oldest else None
    )
    try:
        got = proc.ask("fingerprint")["fingerprint"]
    finally:
        proc.close()
    assert got["nvlink_domain"] == f"{CLUSTER}/7" and got == expected_fingerprint(gpus)
    # a node on no fabric; one whose fabric manager has not registered it yet (in progress)
    for fabric in ({"fabric_cluster": ""}, {"fabric_cluster": CLUSTER, "fabric_state": 2}):
        write_config(config, [FakeGpu(index=0, **fabric)])  # type: ignore[arg-type]
        proc = BackendProcess(lib, config, tmp_path / "backend.log")
        try:
            assert "nvlink_domain" not in proc.ask("fingerprint")["fingerprint"]
        finally:
            proc.close()
    same = {"driver": "570.124.06"}
    prints = {f"node-{i}": same | {"nvlink_domain": f"{CLUSTER}/{i // 2}"} for i in range(5)}
    assert drift(prints) == []


def test_a_field_nvml_cannot_answer_is_left_out(
    backend: Callable[..., BackendProcess], tmp_path: Path
) -> None:
    config = tmp_path / "fake-nvml.conf"
    gpus = [FakeGpu(index=0, errors={"inforom": NOT_SUPPORTED}), FakeGpu(index=1)]
    gpus[1].errors = {"vbios": UNKNOWN, "ecc_mode": NOT_SUPPORTED}
    write_config(config, gpus, system_errors={"cuda_driver_version": NOT_SUPPORTED})
    proc = backend()
    want = expected_fingerprint(gpus)
    for field in ("cuda_driver", "gpu.0.inforom", "gpu.1.vbios", "gpu.1.ecc"):
        del want[field]
    assert proc.ask("fingerprint")["fingerprint"] == want
    assert proc.ask("fingerprint")["fingerprint"] == want
    # Unsupported: never asked again; failed: counted, asked again.
    errors = proc.ask("errors")
    assert errors["errors"] == {"vbios": 2}
    assert errors["unsupported"] == [["inforom"], ["ecc_mode"]]
    assert proc.ask("calls")["calls"]["nvmlSystemGetCudaDriverVersion_v2"] == 1
    # A GPU fallen off the bus since: its name only, the others as before.
    gpus[1].lost = True
    write_config(config, gpus, system_errors={"cuda_driver_version": NOT_SUPPORTED})
    got = proc.ask("fingerprint")["fingerprint"]
    assert got == {k: v for k, v in want.items() if not k.startswith("gpu.1.")} | {
        "gpu.1.name": gpus[1].name
    }
    log = proc.close()
    assert log.count("cuda_driver unavailable") == 1 and log.count("reading vbios failed") == 1


# --- the agent's reports ---------------------------------------------------------------------


def test_the_agent_reports_at_start_and_again_when_a_field_changed(
    tmp_path: Path, lib: Path, coordinator: StandInCoordinator
) -> None:
    gpus = [FakeGpu(index=0), FakeGpu(index=1)]
    url = f"http://127.0.0.1:{coordinator.port}"
    agent = reporting_agent(tmp_path, lib, gpus, url)
    try:
        wait_until(lambda: prints(coordinator), 15, "a fingerprint at start")
        (first,) = prints(coordinator)
        # No probe configured: NVML's fields and the kernel; nothing of the agent's environment.
        assert first == expected_fingerprint(gpus) | KERNEL
        event = next(e for e in coordinator.received if isinstance(e, AgentFingerprintEvent))
        assert event.source == Source(node=agent.node)

        gpus[1].vbios = "96.00.A5.00.7F"  # flashed underneath; SIGHUP reads again at once
        agent.serve()
        agent.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(prints(coordinator)) == 2, 10, "a fingerprint after the change")
        assert prints(coordinator)[1] == expected_fingerprint(gpus) | KERNEL
        samples = agent.scrape()["sentinel_agent_events_total"]
        assert ({"kind": "agent.fingerprint"}, 2.0) in samples
    finally:
        code = agent.stop()
    assert code == 0, agent.log()


def test_the_probe_reads_the_jobs_runtime_with_the_sites_environment(
    tmp_path: Path, lib: Path, coordinator: StandInCoordinator
) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(ENV_FILE)
    gpus = [FakeGpu(index=0)]
    url = f"http://127.0.0.1:{coordinator.port}"
    config = f"  job_python: {sys.executable}\n  job_env_file: {env_file}\n"
    agent = reporting_agent(tmp_path, lib, gpus, url, config)
    try:
        wait_until(lambda: prints(coordinator), 30, "a fingerprint with the job's runtime")
    finally:
        code = agent.stop()
    assert code == 0, agent.log()
    (got,) = prints(coordinator)
    env = {k: v for k, v in got.items() if k.startswith("env.")}
    # The file's NCCL_* and FI_* only: not its other variables, not the agent's NCCL_DEBUG.
    assert env == {
        "env.NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "env.FI_PROVIDER": "efa",
        "env.NCCL_SOCKET_IFNAME": "eth0",
    }
    assert got["python"] == platform.python_version()
    assert got.items() >= (expected_fingerprint(gpus) | KERNEL).items()
    assert "line 6: not KEY=VALUE" in agent.log() and SECRET not in agent.log()


def test_a_failing_probe_leaves_its_fields_out_and_is_logged_once(
    tmp_path: Path, lib: Path, coordinator: StandInCoordinator
) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(ENV_FILE)
    python = script(tmp_path / "python", f'echo "ImportError: {SECRET} went wrong" >&2; exit 3')
    gpus = [FakeGpu(index=0)]
    url = f"http://127.0.0.1:{coordinator.port}"
    config = f"  fingerprint_every_s: 0.3\n  job_python: {python}\n  job_env_file: {env_file}\n"
    agent = reporting_agent(tmp_path, lib, gpus, url, config)
    try:
        wait_until(lambda: len(prints(coordinator)) >= 3, 15, "fingerprints resent")
        assert agent.proc.poll() is None
    finally:
        code = agent.stop()
    assert code == 0, agent.log()
    assert all(p == expected_fingerprint(gpus) | KERNEL for p in prints(coordinator))
    log = agent.log()
    assert log.count("runtime is left out of the fingerprint") == 1
    assert "exit code 3: ImportError: *** went wrong" in log and SECRET not in log


# --- the reporter and the probe on their own ------------------------------------------------


async def test_the_reporter_resends_at_its_cadence_and_on_a_wake_only_what_changed() -> None:
    nvml = {"driver": "570.124.06"}
    sent: list[Event] = []

    async def read_nvml() -> dict[str, str]:
        return dict(nvml)

    async def until(n: int) -> None:
        for _ in range(200):
            if len(sent) >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(sent)} of {n} fingerprints sent")

    reporter = FingerprintReporter(Source(node="n"), read_nvml, sent.extend, every_s=0.5)
    task = asyncio.create_task(reporter.run())
    try:
        await until(1)
        reporter.wake()  # nothing changed: nothing sent
        await asyncio.sleep(0.1)
        assert len(sent) == 1
        nvml["driver"] = "575.51.03"
        reporter.wake()
        await until(2)
        await until(3)  # the same again, at its cadence
    finally:
        task.cancel()
    fields = [e.payload.fields for e in sent if isinstance(e, AgentFingerprintEvent)]
    assert fields == [
        {"driver": "570.124.06"} | KERNEL,
        {"driver": "575.51.03"} | KERNEL,
        {"driver": "575.51.03"} | KERNEL,
    ]


async def test_a_probe_past_its_timeout_or_without_an_interpreter_fails(tmp_path: Path) -> None:
    sleeper = script(tmp_path / "python", f"echo $$ > {tmp_path / 'pid'}; exec sleep 30")
    with pytest.raises(ProbeFailed, match=r"ran past 0\.5 s"):
        await probe_runtime(sleeper, None, timeout_s=0.5)
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed, and reaped
        os.kill(pid, 0)
    with pytest.raises(ProbeFailed, match=r"cannot run agent\.job_python"):
        await probe_runtime(str(tmp_path / "missing"), None)
    garbage = script(tmp_path / "garbage", "echo not json")
    with pytest.raises(ProbeFailed, match="printed no fingerprint"):
        await probe_runtime(garbage, None)
    with pytest.raises(ProbeFailed, match=r"job_env_file .*No such file"):
        await probe_runtime(sys.executable, tmp_path / "absent.env")


def test_the_env_file_reads_as_systemd_reads_it(tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(ENV_FILE + '; another comment\n\nQUOTED="a \\"b\\" c"\nEMPTY=\n')
    assert read_env_file(env_file) == {
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "FI_PROVIDER": "efa",
        "NCCL_SOCKET_IFNAME": "eth0",
        "WANDB_API_KEY": SECRET,
        "QUOTED": 'a "b" c',
        "EMPTY": "",
    }
