"""`sentinel agent` on its real NVML path (pynvml over the fake libnvidia-ml), end to end:
what a Prometheus scrape returns equals what the library served, and an XID the driver
reports turns into a verdict and an event."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fake_nvml import FakeGpu, build_library, fake_env, write_config

from sentinel.lab.sim.fleet import AgentProcess
from sentinel.processes import free_port


def wait_until(pred, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if pred():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def test_agent_process_serves_what_nvml_served(tmp_path: Path) -> None:
    lib = build_library(tmp_path / "lib")
    config = tmp_path / "fake-nvml.conf"
    gpus = [FakeGpu(index=0, temp_gpu=61, power_mw=512_345), FakeGpu(index=1, ecc_sbe_volatile=7)]
    write_config(config, gpus)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "sentinel",
        "agent",
        "--node-id",
        "gpu-node-1",
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        "0.2",
        "--rank-socket",
        str(tmp_path / "agent.sock"),
    ]
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(cmd, env=fake_env(lib, config), stderr=log)
    agent = AgentProcess("gpu-node-1", port, tmp_path / "none", tmp_path / "agent.sock", tmp_path)
    try:
        wait_until(lambda: "DCGM_FI_DEV_GPU_TEMP" in agent.scrape())
        got = agent.scrape()
        temp = {lbl["gpu"]: v for lbl, v in got["DCGM_FI_DEV_GPU_TEMP"]}
        assert temp == {"0": 61.0, "1": float(gpus[1].temp_gpu)}
        uuids = {lbl["gpu"]: lbl["UUID"] for lbl, _ in got["DCGM_FI_DEV_GPU_TEMP"]}
        assert uuids == {"0": gpus[0].uuid, "1": gpus[1].uuid}
        power = {lbl["gpu"]: v for lbl, v in got["sentinel_gpu_power_watts"]}
        assert power["0"] == 512.345
        sbe = {lbl["gpu"]: v for lbl, v in got["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]}
        assert sbe == {"0": 0.0, "1": 7.0}
        # The driver reports XID 79 on GPU 1 and the GPU stops answering.
        gpus[1].lost = True
        write_config(config, gpus, xids=[(1, 79)])
        wait_until(
            lambda: (
                ({"node": "gpu-node-1", "verdict": "unhealthy"}, 1.0)
                in agent.scrape()["sentinel_node_health_verdict"]
            )
        )
        got = agent.scrape()
        assert ({"node": "gpu-node-1", "gpu": "1", "xid": "79"}, 1.0) in got[
            "sentinel_gpu_xid_errors_total"
        ]
        assert [v for lbl, v in got["sentinel_gpu_lost"] if lbl["gpu"] == "1"] == [1.0]
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        log.close()


def test_agent_without_a_driver_says_so_and_exits_nonzero(tmp_path: Path) -> None:
    lib = build_library(tmp_path / "lib")
    config = tmp_path / "fake-nvml.conf"
    write_config(config, [FakeGpu(index=0)], init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    cmd = [
        sys.executable,
        "-m",
        "sentinel",
        "agent",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--rank-socket",
        str(tmp_path / "s.sock"),
    ]
    res = subprocess.run(cmd, env=fake_env(lib, config), capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    assert "cannot read GPUs" in res.stderr and "--sim" in res.stderr
