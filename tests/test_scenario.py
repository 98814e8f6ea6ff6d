from pathlib import Path

import pytest

from sentinel.exitcodes import InputError
from sentinel.scenario import Scenario, load_scenario, shipped_scenarios

DESIGN_EXAMPLE = """
fleet:   {nodes: 4, gpus_per_node: 2, spares: 1}
trainer: {tp: 2, pp: 2, dp: 2, steps: 120, checkpoint_every: 20, seed: 7}
faults:
  - {kind: ecc_dbe,        node: node-2, gpu: 0, at_step: 45}
  - {kind: xid,            node: node-1, gpu: 1, xid: 79, at_step: 50}
  - {kind: thermal,        node: node-0, gpu: 1, temp_c: 96, at_step: 30}
  - {kind: corrupt_batch,  batch: 70}
  - {kind: sdc,            rank: 3, at_step: 60}
  - {kind: straggler,      rank: 5, slowdown: 1.3, at_step: 30}
  - {kind: hang,           rank: 6, at_step: 100}
  - {kind: crash,          rank: 2, at_step: 80}
  - {kind: link_degraded,  node: node-3, factor: 0.25}
"""


def test_design_example_parses(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(DESIGN_EXAMPLE)
    s = load_scenario(f)
    assert s.name == "s"
    assert [x.kind for x in s.faults][:3] == ["ecc_dbe", "xid", "thermal"]
    assert s.fleet.node_of_rank(5) == "node-2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("faults: [{kind: meteor}]", "faults.0"),
        (
            "faults: [{kind: ecc_dbe, node: node-9, gpu: 0, at_step: 1}]",
            "node-9 is not in the fleet",
        ),
        ("faults: [{kind: hang, rank: 99, at_step: 1}]", "faults.0.rank: 99 >= world size 8"),
        ("trainer: {tp: 3}", "must equal the fleet's GPUs"),
        ("fleet: {nodes: 4, gpus: 2}", "fleet.gpus: Extra inputs are not permitted"),
        # the catalog's repair table: SDC may have reached every replica, never the live path
        (
            "recovery: live\nfaults: [{kind: sdc, rank: 3, at_step: 5}]",
            r"recovery: live is not a path for faults.0 \(sdc\): corrupt gradients spread to "
            "every replica through the all-reduce.*it allows warm_restart, restart",
        ),
        ("recovery: sideways", "recovery: Input should be 'live', 'warm_restart' or 'restart'"),
    ],
)
def test_bad_scenarios_are_rejected_precisely(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=message):
        load_scenario(f)


def test_every_problem_is_reported_at_once_with_its_path(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        "fleet: {nodes: 2, gpus_per_node: 2}\n"
        "faults:\n"
        "  - {kind: ecc_dbe, node: node-7, gpu: 5, at_step: 3}\n"
        "  - {kind: hang, rank: 9, at_step: 4}\n"
    )
    with pytest.raises(InputError) as e:
        load_scenario(f)
    lines = str(e.value).splitlines()[1:]
    assert [line.strip() for line in lines] == [
        "trainer: tp*pp*dp = 8 must equal the fleet's GPUs (2 nodes x 2 = 4)",
        "faults.0.node: node-7 is not in the fleet",
        "faults.0.gpu: 5 >= gpus_per_node (2)",
        "faults.1.rank: 9 >= world size 4",
    ]


def test_an_unknown_name_lists_the_shipped_scenarios() -> None:
    with pytest.raises(InputError) as e:
        load_scenario("link_degradd")
    assert str(e.value) == (
        "no scenario file or shipped scenario named 'link_degradd'; shipped: "
        + ", ".join(shipped_scenarios())
    )
    assert "link_degraded" in shipped_scenarios() and "default" in shipped_scenarios()


def test_quick_shortens_every_shipped_drill_and_keeps_its_schedule() -> None:
    from sentinel.lab.demo.quick import quick

    def timed(s: Scenario) -> list[int]:
        return [getattr(f, "at_step", getattr(f, "batch", -1)) for f in s.faults]

    steps = {n: quick(load_scenario(n)).trainer.steps for n in shipped_scenarios()}
    full = {n: load_scenario(n).trainer.steps for n in shipped_scenarios()}
    # An SDC fault is seen at the spot check after it (every 25 drill steps) and confirmed at
    # the exchange after that: its drills need their whole 40 steps to prove the repair.
    uncut = {"sdc", "validation"}
    assert all(steps[n] < full[n] for n in full if n not in uncut), (steps, full)
    assert all(steps[n] == full[n] for n in uncut)
    # Default: every timed fault one checkpoint interval (10) earlier, the corrupt batch as far
    # as its detector allows (batch 35 >= 30); training ends one interval after the last fault
    # (the hang at 76: its rollback to 70 passes it again).
    default, short = load_scenario("default"), quick(load_scenario("default"))
    assert timed(short) == [-1, 35, 42, 48, 58, 66, 76] and short.trainer.steps == 86
    assert [f.kind for f in short.faults] == [f.kind for f in default.faults]
    assert steps == {
        "default": 86,
        "config_drift": 20,
        "corrupt_batch": 40,
        "crash": 35,
        "ecc_dbe": 35,
        "hang": 35,
        "hidden_hang": 37,
        "link_degraded": 20,
        "poison_crash": 35,
        "sdc": 40,
        "straggler": 60,
        "thermal": 32,
        "validation": 40,
        "xid": 35,
        "live": 105,
        "live_overlap": 37,
    }
    # A fault already at its earliest stays; the corrupt batch moves to its earliest, 30.
    assert timed(quick(load_scenario("crash"))) == [15]
    assert timed(quick(load_scenario("corrupt_batch"))) == [30]


def test_quick_mirrors_the_hooks_shipped_warmups() -> None:
    """`sentinel` cannot import trainer_hooks: the warm-ups quick() respects must match them."""
    from sentinel.lab.demo.quick import (
        CORRUPT_BATCH_EARLIEST,
        LOSS_SPIKE_WARMUP,
        STRAGGLER_BASELINE,
        STRAGGLER_OVER,
    )
    from trainer_hooks.anomaly import make_policy
    from trainer_hooks.config import HooksConfig

    assert make_policy(HooksConfig().anomaly_policy, "loss").warmup == LOSS_SPIKE_WARMUP  # type: ignore[attr-defined]
    assert HooksConfig().straggler_over == STRAGGLER_OVER
    assert HooksConfig().straggler_baseline == STRAGGLER_BASELINE
    assert CORRUPT_BATCH_EARLIEST >= LOSS_SPIKE_WARMUP


def test_the_validation_scenario_returns_a_node_of_its_fleet() -> None:
    from pydantic import ValidationError

    from sentinel.lab.demo.quick import quick

    sc = load_scenario("validation")
    assert sc.returns is not None and sc.returns.node == "node-1" and sc.returns.damage == ["sdc"]
    assert quick(sc).returns == sc.returns  # --quick keeps the returns drill
    doc = sc.model_dump() | {"returns": {"node": "node-7", "gpu": 2}}
    with pytest.raises(ValidationError) as e:
        Scenario.model_validate(doc)
    assert "returns.node: node-7 is not in the fleet" in str(e.value)
    assert "returns.gpu: 2 >= gpus_per_node (2)" in str(e.value)


def test_a_recovery_every_fault_allows_is_taken() -> None:
    ecc = {"kind": "ecc_dbe", "node": "node-1", "gpu": 0, "at_step": 5}
    doc = {"recovery": "live", "faults": [ecc, {"kind": "crash", "rank": 2, "at_step": 9}]}
    assert Scenario.model_validate(doc).recovery == "live"
    assert Scenario.model_validate({**doc, "recovery": "restart"}).recovery == "restart"
