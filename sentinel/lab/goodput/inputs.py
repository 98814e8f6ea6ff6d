"""Every number the projection uses, with where it came from: measured, a setting, an assumption.

Sentinel's own times come from the drills' measurements (`measurements.py`): detection and
repair per fault class, the repair stage by stage. Two detectors run time-compressed in a drill
(docs/drills.md), so their measurement is carried to a real run through the shipped setting it
compresses:

- hang: the watchdog's shipped timeout, max(hang_floor_s, hang_k x step time), plus the seconds
  the drill measured past its own (compressed) timeout: the report's delivery and the incident.
- sdc: the steps from the strike to the detection, measured in drill steps and multiplied by the
  compression (the spot check's period is in steps), times a real run's step time.

A repair's measured stages are carried to the fleet's scale by `repairs.py`, with the inputs of
`scale_inputs.py`. What no drill here can measure is an assumption with its source: a real
node's repair, the fleet's checkpoint bandwidths, a real step time, how a repair's parts grow
with the ranks, and the baseline's timeouts. A class no drill times keeps Sentinel's old default
as an assumption, said so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sentinel.lab.goodput.checkpoint import CheckpointSpec
from sentinel.lab.goodput.measurements import Measurements
from sentinel.lab.goodput.model import (
    JOB_TIMEOUT_S,
    RESUME_S,
    SENTINEL_DETECT_S,
    LiveSpec,
    RecoveryModel,
    RepairPath,
)
from sentinel.lab.goodput.origin import Input, Origin
from sentinel.lab.goodput.paths import Recovery, paths_for
from sentinel.lab.goodput.recovery_bench import RecoveryBench, read_recovery_bench
from sentinel.lab.goodput.repairs import (
    MODEL_STAGES,
    Layout,
    full_stop_parts,
    live_parts,
    stage_key,
    trainer_restart_s,
    whole_key,
)
from sentinel.lab.goodput.scale_inputs import live_rows, scale_rows
from sentinel.lab.goodput.trace import FaultClass

# Mirrors of trainer_hooks' shipped HooksConfig (`sentinel` does not import `trainer_hooks`; a
# test checks they match): the hang watchdog's floor and its multiple of the slowest step.
HANG_FLOOR_S = 60.0
HANG_K = 5.0
# A real step: Llama 3 405B on 16,384 H100s ("The Llama 3 Herd of Models", Table 4): 16M tokens
# a batch at 400 TFLOPs per GPU; 6 x params FLOPs per token (attention left out) -> 6.22 s.
LLAMA3_STEP_S = 6 * 405e9 * 16 * 2**20 / (16384 * 400e12)
BASELINE_INTERVAL_S = 3600.0
MANUAL_REPLACE_MIN = 30.0
NODE_REPAIR_H = 12.0


@dataclass(frozen=True)
class Plan:
    """What the projection holds fixed while its inputs vary (the sensitivity table's rows)."""

    gpus: int
    spares: int
    interval_s: float | None  # Sentinel's fixed checkpoint interval; None: Young/Daly
    asynchronous: bool
    recovery: Recovery = Recovery.CATALOG
    keep_batch: bool = True  # the live path keeps the global batch while a replica is out


def _measured(m: Measurements, where: str, cls: FaultClass, figure: str) -> str:
    fig = m.classes[cls]
    n = f"{fig.samples} sample{'s' if fig.samples != 1 else ''}"
    return f"{where} ({m.date}): {figure}, mean of {n} ({', '.join(fig.scenarios)})"


def _default(cls: FaultClass, what: str, m: Measurements) -> str:
    return f"Sentinel's default {what} (sentinel/lab/goodput/model.py); {m.classes[cls].note}"


def sentinel_rows(m: Measurements, where: str) -> list[Input]:
    """Sentinel's detection and repair inputs per class, from the measurements where they have
    them (hang and sdc through their shipped settings), else its old defaults, as assumptions.
    A measured repair with its recorded stages is given by them (`repairs.py` carries them to
    the fleet's scale); one without, whole."""
    rows: list[Input] = []
    for cls in FaultClass:
        rows += _detect_rows(cls, m, where)
        fig = m.classes[cls]
        if fig.repair_s is not None and fig.stages_s:
            measured = functools.partial(_measured, m, where, cls)
            rows += _stage_rows(cls, cls, m, "measured", measured)
        elif fig.repair_s is not None:
            whole = _measured(m, where, cls, "repair") + "; no stages: taken whole at any scale"
            rows.append(
                Input(whole_key(cls), f"repair: {cls}", fig.repair_s, "s", "measured", whole)
            )
        else:
            rows += _repair_assumption(cls, m)
    return rows


def _stage_rows(
    cls: FaultClass, of: FaultClass, m: Measurements, origin: Origin, source: Callable[[str], str]
) -> list[Input]:
    """`cls`'s repair as `of`'s stages the model reads, as the coordinator recorded them in the
    drills (from the fault's first signal to the new gang's first step: they start a little
    before the repair, so they need not add up to it exactly)."""
    fig = m.classes[of]
    return [
        Input(
            stage_key(cls, name),
            f"repair: {cls}: {name}",
            fig.stages_s[name],
            "s",
            origin,
            source(f"coordinator-recorded stage {name} (of a {fig.repair_s:g} s repair)"),
        )
        for name in MODEL_STAGES
        if name in fig.stages_s
    ]


def _repair_assumption(cls: FaultClass, m: Measurements) -> list[Input]:
    key, label = whole_key(cls), f"repair: {cls}"
    node = m.classes[FaultClass.NODE]
    if cls == FaultClass.LINK and node.repair_s is not None:

        def why(what: str) -> str:
            return (
                f"the node's measured {what} (the same evict, swap, restart); {m.classes[cls].note}"
            )

        if node.stages_s:
            return _stage_rows(cls, FaultClass.NODE, m, "assumption", why)
        return [Input(key, label, node.repair_s, "s", "assumption", why("repair"))]
    src = _default(cls, "repair time", m) + "; taken whole at any scale"
    return [Input(key, label, RESUME_S[cls], "s", "assumption", src)]


def _detect_rows(cls: FaultClass, m: Measurements, where: str) -> list[Input]:
    fig = m.classes[cls]
    if cls == FaultClass.HANG and fig.past_watchdog_s is not None:
        past = _measured(m, where, cls, "detection past the drill's watchdog")
        return [
            Input(
                "hang_watchdog_s",
                "hang watchdog floor",
                HANG_FLOOR_S,
                "s",
                "setting",
                "trainer hooks' shipped hang_floor_s (timeout: max(floor, 5 x step time))",
            ),
            Input(
                "sentinel.hang_past_watchdog_s",
                "detection: hang, past the watchdog",
                fig.past_watchdog_s,
                "s",
                "measured",
                past,
            ),
        ]
    if cls == FaultClass.SDC and fig.detect_steps_shipped is not None:
        steps = _measured(m, where, cls, "drill steps to detection x compression")
        return [
            Input(
                "sentinel.sdc_detect_steps",
                "detection: sdc, steps after the strike",
                fig.detect_steps_shipped,
                "steps",
                "measured",
                steps,
            )
        ]
    key, label = f"sentinel.detect_s.{cls}", f"detection: {cls}"
    if cls not in (FaultClass.HANG, FaultClass.SDC) and fig.detect_s is not None:
        return [
            Input(key, label, fig.detect_s, "s", "measured", _measured(m, where, cls, "detection"))
        ]
    return [
        Input(
            key,
            label,
            SENTINEL_DETECT_S[cls],
            "s",
            "assumption",
            _default(cls, "detection time", m),
        )
    ]


def common_rows(spec: CheckpointSpec) -> list[Input]:
    """Inputs of both models (a real fleet's, not measurable here) and the baseline's own."""
    return [
        Input("step_s", "step time of the real run", LLAMA3_STEP_S, "s", "assumption",
              "Llama 3 405B on 16,384 H100s (Llama 3 paper, Table 4: 16M tokens a batch at "
              "400 TFLOPs/GPU, 6 x params FLOPs a token); sets sdc detection and the hang "
              "watchdog's k x step"),
        Input("node_repair_h", "a swapped-out node's repair", NODE_REPAIR_H, "h", "assumption",
              "default (--node-repair-h): a real node's diagnosis, reboot or part swap, and "
              "return to the pool; not measurable on a simulated fleet"),
        Input("manual_replace_min", "node replaced by hand (no spare)", MANUAL_REPLACE_MIN,
              "min", "assumption", "default: an operator swaps the node (no source; a guess)"),
        Input("checkpoint.params", "model parameters", spec.params, "", "assumption",
              "Llama 3 405B, the reference trace's model (--model-params)"),
        Input("checkpoint.bytes_per_param", "checkpointed bytes per parameter",
              spec.bytes_per_param, "B", "assumption",
              "bf16 weights 2 + fp32 master 4 + AdamW moments 8 (--bytes-per-param)"),
        Input("checkpoint.staging_gbps", "staging into host memory", spec.staging_gb_per_s,
              "GB/s", "assumption", "a fifth of PCIe Gen5 x16's ~55 GB/s peak (--staging-gbps)"),
        Input("checkpoint.coordination_s", "save-plan exchange and barrier", spec.coordination_s,
              "s", "assumption", "20-50x the 0.02-0.06 s measured at 2-8 ranks here "
              "(benchmarks/checkpoint.py) for 16,384 ranks (--coordination-s)"),
        Input("checkpoint.storage_tbps", "storage bandwidth", spec.storage_tb_per_s,
              "TB/s", "assumption", "Llama 3 paper 3.3.1: Tectonic sustains 2 TB/s; a save's "
              "write and a restart's read of every rank at once (--storage-tbps)"),
        Input("baseline.detect_s", "baseline detection (job timeout)", JOB_TIMEOUT_S, "s",
              "assumption", "PyTorch's default process-group timeout for NCCL, 10 min"),
        Input("baseline.interval_s", "baseline checkpoint interval", BASELINE_INTERVAL_S, "s",
              "assumption", "default: a fixed hourly checkpoint"),
    ]  # fmt: skip


def default_rows(
    m: Measurements,
    where: str,
    bench: RecoveryBench | None = None,
    bench_where: str | None = None,
) -> list[Input]:
    """The inputs with no flag given: the measurements, the recovery benchmark's run (the
    shipped one unless given), the assumptions' defaults."""
    if bench is None or bench_where is None:
        bench, bench_where = read_recovery_bench()
    return (
        sentinel_rows(m, where)
        + live_rows(bench, bench_where)
        + common_rows(CheckpointSpec())
        + scale_rows()
    )


def _replaces(key: str, other: str) -> bool:
    """Whether `key`, given directly, replaces the input `other`: a class's detection replaces
    the inputs it was derived from (hang's and sdc's); its repair given whole, its stages."""
    if other == key:
        return True
    if key == "sentinel.detect_s.hang":
        return other in ("hang_watchdog_s", "sentinel.hang_past_watchdog_s")
    if key == "sentinel.detect_s.sdc":
        return other == "sentinel.sdc_detect_steps"
    stages = key.replace("sentinel.resume_s.", "sentinel.repair_stage_s.", 1) + "."
    return key.startswith("sentinel.resume_s.") and other.startswith(stages)


def override(
    rows: list[Input], key: str, value: float, source: str, label: str | None = None
) -> list[Input]:
    """`rows` with `key` set from the command line (`source` starts with "--") or a drill's
    file, in place of the inputs it replaces (`_replaces`)."""
    old = next((r for r in rows if r.key == key), None)
    if label is None:
        label = old.label if old else _label(key)
    unit = old.unit if old else "s"
    origin: Origin = "command line" if source.startswith("--") else "measured"
    new = Input(key, label, value, unit, origin, source + _whole_note(key))
    at = next((i for i, r in enumerate(rows) if _replaces(key, r.key)), len(rows))
    kept = [r for r in rows if not _replaces(key, r.key)]
    return [*kept[:at], new, *kept[at:]]


def with_drill_times(
    rows: list[Input],
    detect: Mapping[FaultClass, float],
    resume: Mapping[FaultClass, float],
    source: str,
) -> list[Input]:
    """`rows` with a drill's measured detection and resume per class in place of the inputs
    they replace (a resume taken whole at any scale)."""
    for cls, seconds in detect.items():
        rows = override(rows, f"sentinel.detect_s.{cls}", seconds, source)
    for cls, seconds in resume.items():
        rows = override(rows, f"sentinel.resume_s.{cls}", seconds, source)
    return rows


def _label(key: str) -> str:
    kind = "repair" if key.startswith("sentinel.resume_s.") else "detection"
    return f"{kind}: {key.rsplit('.', 1)[1]}"


def _whole_note(key: str) -> str:
    return "; taken whole at any scale" if key.startswith("sentinel.resume_s.") else ""


def build_models(
    values: Mapping[str, float], plan: Plan
) -> tuple[RecoveryModel, RecoveryModel, CheckpointSpec]:
    """The Sentinel and baseline models from the inputs' values (the one place they meet), at
    the plan's scale and with its paths."""
    spec = CheckpointSpec(
        params=values["checkpoint.params"],
        bytes_per_param=values["checkpoint.bytes_per_param"],
        staging_gb_per_s=values["checkpoint.staging_gbps"],
        coordination_s=values["checkpoint.coordination_s"],
        storage_tb_per_s=values["checkpoint.storage_tbps"],
        asynchronous=plan.asynchronous,
    )
    cost = values.get("checkpoint.cost_s", spec.blocking_s(plan.gpus))
    common = {
        "checkpoint_cost_s": cost,
        "checkpoint_commit_lag_s": spec.commit_lag_s(),
        "node_repair_s": values["node_repair_h"] * 3600.0,
        "manual_replace_s": values["manual_replace_min"] * 60.0,
    }
    lay = Layout.of(values, plan.gpus)
    paths = paths_for(plan.recovery)
    live = _live_spec(values, lay, plan) if RepairPath.LIVE in paths.values() else None
    sentinel = RecoveryModel(
        name="sentinel",
        detect_s={c: sentinel_detect_s(values, c) for c in FaultClass},
        resume_s={c: _full_stop_s(values, c, paths[c], lay, live) for c in FaultClass},
        spares=plan.spares,
        checkpoint_interval_s=plan.interval_s,
        path=paths,
        live=live,
        **common,  # type: ignore[arg-type]
    )
    baseline = RecoveryModel(
        name="baseline",
        detect_s=dict.fromkeys(FaultClass, values["baseline.detect_s"]),
        resume_s=dict.fromkeys(FaultClass, trainer_restart_s(values, lay)),
        spares=0,
        checkpoint_interval_s=values["baseline.interval_s"],
        **common,  # type: ignore[arg-type]
    )
    return sentinel, baseline, spec


def _live_spec(values: Mapping[str, float], lay: Layout, plan: Plan) -> LiveSpec:
    parts = live_parts(values, lay)
    return LiveSpec(
        stall_s=values["live.stall_s"],
        regroup_s=sum(parts.regroup.values()),
        join_s=sum(parts.join.values()),
        replicas=lay.replicas,
        microbatches=max(1, round(values["layout.microbatches"])),
        keep_batch=plan.keep_batch,
    )


def _full_stop_s(
    values: Mapping[str, float],
    cls: FaultClass,
    path: RepairPath,
    lay: Layout,
    live: LiveSpec | None,
) -> float:
    """Seconds from the replacement node in place to training again, for a class whose path
    stops every rank; none for a class the live path repairs."""
    if path == RepairPath.LIVE and live is not None and live.replicas >= 2:
        return 0.0
    return sum(full_stop_parts(values, cls, path, lay, replicated=live is not None).values())


def sentinel_detect_s(values: Mapping[str, float], cls: FaultClass) -> float:
    direct = values.get(f"sentinel.detect_s.{cls}")
    if direct is not None:
        return direct
    if cls == FaultClass.HANG:
        timeout = max(values["hang_watchdog_s"], HANG_K * values["step_s"])
        return timeout + values["sentinel.hang_past_watchdog_s"]
    if cls == FaultClass.SDC:
        return values["sentinel.sdc_detect_steps"] * values["step_s"]
    raise KeyError(f"sentinel.detect_s.{cls}")
