from pathlib import Path

import pytest

from sentinel.exitcodes import InputError
from sentinel.scenario import load_scenario

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
        ("faults: [{kind: hang, rank: 99, at_step: 1}]", "rank 99 >= world size 8"),
        ("trainer: {tp: 3}", "must equal the fleet's GPUs"),
        ("fleet: {nodes: 4, gpus: 2}", "fleet.gpus: Extra inputs are not permitted"),
    ],
)
def test_bad_scenarios_are_rejected_precisely(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=message):
        load_scenario(f)
