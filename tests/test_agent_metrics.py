"""The agent's exposition: what a scrape returns, checked with Prometheus' own parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent.export.dcgm import DCGM_FIELDS, XID
from sentinel.agent.export.exposition import TextRenderer
from sentinel.agent.export.rank_metrics import STEP_SERIES, RankMetrics
from sentinel.agent.nvml.readings import GpuBackend, GpuReading, XidEvent
from sentinel.agent.nvml.sim import SimulatedGpus, inject
from sentinel.agent.service import Agent
from sentinel.config import AgentConfig, DcgmNaming
from sentinel.protocol import RankStepEvent, RankStepPayload, Source


def agent_with(backend: GpuBackend, dcgm_names: DcgmNaming = "legacy") -> Agent:
    cfg = AgentConfig(node_id="node-7", rank_socket=None, dcgm_names=dcgm_names)
    return Agent(cfg, backend, None)


def samples(agent: Agent) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = TextRenderer().render(agent.registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_renderer_is_byte_identical_to_prometheus_client(tmp_path: Path) -> None:
    faults = tmp_path / "f.jsonl"
    sim = SimulatedGpus(8, faults_file=faults, node_id="node-7")
    agent = agent_with(sim)
    inject(faults, {"kind": "xid", "gpu": 2, "xid": 79})
    inject(faults, {"kind": "ecc_dbe", "gpu": 1})
    inject(faults, {"kind": "thermal", "gpu": 4, "temp_c": 97})
    renderer = TextRenderer()
    for _ in range(3):  # the second and third renders come from the label cache
        agent.monitor.collect()
        assert renderer.render(agent.registry) == generate_latest(agent.registry)


def test_every_dcgm_series_has_dcgm_labels_and_units() -> None:
    agent = agent_with(SimulatedGpus(2, node_id="node-7"))
    agent.monitor.collect()
    got = samples(agent)
    reading = agent.monitor.snapshot.readings[0]  # type: ignore[union-attr]
    for field in DCGM_FIELDS:
        if field.value(reading, current=False) is None:
            continue
        rows = got[field.legacy]
        assert len(rows) == 2, field.legacy
        labels = rows[0][0]
        assert labels["Hostname"] == "node-7" and labels["device"] == "nvidia0"
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3" and labels["UUID"].startswith("GPU-")
    assert not any(f.current in got for f in DCGM_FIELDS if f.current != f.legacy)  # the default
    fb_used = {lbl["gpu"]: v for lbl, v in got["DCGM_FI_DEV_FB_USED"]}
    assert fb_used["0"] == reading.fb_used_bytes / 2**20  # type: ignore[operator]  # MiB
    power = {lbl["gpu"]: v for lbl, v in got["sentinel_gpu_power_watts"]}
    assert power["0"] == reading.power_w


def test_dcgm_47_names_carry_base_units_and_the_hostname_label() -> None:
    """dcgm-exporter 4.9's naming (DCGM 4.7's fields): 23 names changed, 7 of them to base
    units, the node in `hostname`; with `both`, each GPU under both namings."""
    renamed = [f for f in (*DCGM_FIELDS, XID) if f.current != f.legacy]
    assert len(renamed) == 23
    agent = agent_with(SimulatedGpus(2, node_id="node-7"), "dcgm-4.7")
    agent.monitor.collect()
    got = samples(agent)
    r = agent.monitor.snapshot.readings[0]  # type: ignore[union-attr]
    assert not any(f.legacy in got for f in renamed)
    first = {name: rows[0] for name, rows in got.items() if name.startswith("DCGM_FI_")}
    assert all("hostname" in lbl and "Hostname" not in lbl for lbl, _ in first.values())
    base_units = {
        "DCGM_FI_DEV_SM_CLOCK_HERTZ": r.sm_clock_mhz * 1e6,  # type: ignore[operator]
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": r.mem_clock_mhz * 1e6,  # type: ignore[operator]
        "DCGM_FI_DEV_GPU_UTIL_RATIO": r.util_gpu_pct / 100,  # type: ignore[operator]
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO": r.util_mem_pct / 100,  # type: ignore[operator]
        "DCGM_FI_DEV_FB_USED_BYTES": r.fb_used_bytes,
        "DCGM_FI_DEV_FB_FREE_BYTES": r.fb_free_bytes,
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": r.energy_mj / 1000,  # type: ignore[operator]
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS": r.temp_gpu_c,
        "DCGM_FI_DEV_BOARD_POWER_WATTS": r.power_w,
        "DCGM_FI_DEV_XID_ERROR": 0.0,
    }
    assert {k: first[k][1] for k in base_units} == pytest.approx(base_units)
    both = agent_with(SimulatedGpus(2, node_id="node-7"), "both")
    both.monitor.collect()
    got = samples(both)
    served = [f for f in renamed if f.legacy in got]  # an H100 retires no pages: none of those
    assert len(served) >= 19 and all(len(got[f.legacy]) == len(got[f.current]) == 2 for f in served)


class PartialBackend(GpuBackend):
    """A GPU whose driver supports only a few fields, and a second GPU that is lost."""

    def gpu_count(self) -> int:
        return 2

    def read(self, index: int) -> GpuReading:
        if index == 1:
            return GpuReading(index=1, uuid="GPU-b", lost=True)
        return GpuReading(index=0, uuid="GPU-a", name="Old GPU", temp_gpu_c=50.0, power_w=100.0)

    def drain_xids(self) -> list[XidEvent]:
        return [XidEvent(gpu=0, xid=13), XidEvent(gpu=0, xid=31), XidEvent(gpu=0, xid=13)]


def test_unsupported_fields_are_missing_not_zero_and_xids_count_per_code() -> None:
    agent = agent_with(PartialBackend())
    agent.monitor.collect()
    got = samples(agent)
    assert [v for lbl, v in got["DCGM_FI_DEV_GPU_TEMP"]] == [50.0]  # GPU 1 lost: no value
    assert "DCGM_FI_DEV_SM_CLOCK" not in got  # no GPU reports it: no series at all
    unavailable = {(lbl["gpu"], lbl["field"]) for lbl, _ in got["sentinel_gpu_field_unavailable"]}
    assert ("0", "sm_clock_mhz") in unavailable and ("0", "temp_gpu_c") not in unavailable
    assert [v for lbl, v in got["sentinel_gpu_lost"] if lbl["gpu"] == "1"] == [1.0]
    xids = {lbl["xid"]: v for lbl, v in got["sentinel_gpu_xid_errors_total"]}
    assert xids == {"13": 2.0, "31": 1.0}  # dcgm-exporter's gauge would show only the last
    last = {lbl["gpu"]: v for lbl, v in got["DCGM_FI_DEV_XID_ERRORS"]}
    assert last["0"] == 13.0
    verdicts = {lbl["verdict"] for lbl, v in got["sentinel_node_health_verdict"] if v == 1}
    assert verdicts == {"unhealthy"}  # the lost GPU


def test_rank_step_fields_are_re_exported_from_the_typed_payload() -> None:
    """Every series reads a field of `RankStepPayload`; a field a rank cannot measure (null)
    has no sample rather than a zero."""
    assert {field for field, *_ in STEP_SERIES} <= RankStepPayload.model_fields.keys()
    metrics = RankMetrics()
    payload = RankStepPayload(step=12, step_s=0.5, compute_s=0.4, comm_s=0.1, tflops=2.5, loss=1.5)
    metrics.observe(RankStepEvent(source=Source(node="node-7", rank=3, job="j1"), payload=payload))
    got = {
        m.name: [(s.labels["rank"], s.value) for s in m.samples] for m in metrics.collect("node-7")
    }
    assert got["sentinel_rank_loss"] == [("3", 1.5)]
    assert got["sentinel_rank_flops_per_second"] == [("3", 2.5e12)]
    assert got["sentinel_rank_step"] == [("3", 12.0)]
    assert got["sentinel_rank_mfu_ratio"] == []
