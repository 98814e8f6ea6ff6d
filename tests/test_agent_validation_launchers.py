"""Where the agent runs a returning node's validation burn-in: its launchers, and the shipped
template unit they start.

The Slurm launcher runs end to end on a real cluster in `test_slurm_validation.py`. This
machine runs no systemd, so the systemd launcher is driven here through a stand-in for
`systemctl` that does what systemd does with the shipped template unit and nothing more: it
substitutes the instance (`%i`) and the unit's environment file into the unit's own ExecStart
and runs it. The one liberty it takes is the interpreter: /opt/sentinel-validate does not exist
here, so it runs the test's own; and the unit's folder, /var/lib/sentinel/validate, is the
test's. The unit's sandbox itself is not applied.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from sentinel.agent.uplink.validation import UNIT_TEMPLATE, NodeValidator
from sentinel.config import AgentConfig, NodeValidationConfig
from sentinel.protocol import Command, Event, NodeValidationPayload, Source
from tests.helpers.unit_sandbox import unit_settings

DEPLOY = Path(__file__).parent.parent / "deploy"
TEMPLATE = DEPLOY / "systemd" / "sentinel-validate@.service"
AGENT_UNIT = DEPLOY / "systemd" / "sentinel-agent.service"
UNIT_PYTHON = "/opt/sentinel-validate/bin/python"
UNIT_WORKDIR = "/var/lib/sentinel/validate"

STANDIN = """
import os, re, signal, subprocess, sys
verb, unit = sys.argv[1], sys.argv[2]
log, template = {log!r}, {template!r}
with open(log, "a") as f:
    f.write(f"{{verb}} {{unit}}\\n")
pidfile = log + "." + unit + ".pid"
if verb == "stop":
    os.kill(int(open(pidfile).read()), signal.SIGKILL)
    sys.exit(0)
instance = re.fullmatch(r"sentinel-validate@(.+)\\.service", unit).group(1)
keys = {{}}
for line in open(template).read().splitlines():
    if "=" in line and not line.startswith("#"):
        key, _, value = line.partition("=")
        keys[key] = value.replace("%i", instance).replace({unit_workdir!r}, {workdir!r})
env = dict(line.split("=", 1) for line in open(keys["EnvironmentFile"]).read().split())
argv = [env.get(w[2:-1], w) if w.startswith("${{") else w for w in keys["ExecStart"].split()]
argv[0] = argv[0].replace({unit_python!r}, sys.executable)
child = subprocess.Popen(argv, cwd={root!r})
open(pidfile, "w").write(str(child.pid))
sys.exit(child.wait())
"""


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """This machine's figures, recorded by the real command."""
    path = tmp_path_factory.mktemp("baseline") / "baseline.json"
    argv = [sys.executable, "-m", "sentinel", "burnin", "--validate", "--gpus", "1"]
    subprocess.run([*argv, "--save-baseline", str(path)], check=True, capture_output=True)
    return dict(json.loads(path.read_text())["validation"])


def systemctl_standin(tmp_path: Path, workdir: Path) -> tuple[Path, Path]:
    """An executable standing in for systemctl, and the log of what it was asked."""
    log, script = tmp_path / "systemctl.log", tmp_path / "systemctl"
    root = str(Path(__file__).parent.parent)
    body = STANDIN.format(
        log=str(log),
        template=str(TEMPLATE),
        unit_python=UNIT_PYTHON,
        unit_workdir=UNIT_WORKDIR,
        workdir=str(workdir),
        root=root,
    )
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return script, log


def validate(validator: NodeValidator, args: dict[str, Any]) -> NodeValidationPayload:
    """Run one request through the validator's own task; its verdict as the agent sends it."""
    sent: list[Event] = []
    validator.emit = sent.extend

    async def run() -> None:
        assert validator.start(
            Command(kind="node.validate", target=Source(node="node-7"), args=args)
        )
        while validator._running:
            await asyncio.sleep(0.05)

    asyncio.run(run())
    return NodeValidationPayload.model_validate(sent[0].payload)


def test_the_template_unit_runs_what_the_agent_asks_with_the_nodes_own_limits() -> None:
    unit = unit_settings(TEMPLATE.read_text())
    agent = unit_settings(AGENT_UNIT.read_text())
    shipped = yaml.safe_load((DEPLOY / "agent.yaml").read_text())["agent"]["validation"]
    workdir = Path(shipped["workdir"])
    assert shipped["launcher"] == "systemd" and str(workdir) == UNIT_WORKDIR
    # the agent's command line for a folder of the workdir is the unit's, word for word
    folder = workdir / "%i"
    validator = NodeValidator("n", 1, lambda _: None, cfg=NodeValidationConfig(**shipped))
    want = validator.burnin_argv(UNIT_PYTHON, folder, "${GPUS}")
    assert unit["ExecStart"] == [" ".join(want)]
    assert unit["EnvironmentFile"] == [f"{folder}/env"]
    assert unit["ReadWritePaths"] == [str(workdir)]
    # the agent's user, and the GPUs the burn-in computes on; none of the agent's caps
    assert (unit["User"], unit["Group"]) == (agent["User"], agent["Group"])
    allowed = {v.split()[0] for v in unit["DeviceAllow"]}
    assert {"char-nvidiactl", "char-nvidia-uvm", "char-nvidia-frontend"} <= allowed
    assert not {"MemoryMax", "CPUQuota", "TasksMax"} & unit.keys()
    # the polkit rule admits exactly the agent's instance names
    rule = re.search(r"/\^(.+)\$/", (DEPLOY / "systemd" / "sentinel-validate.rules").read_text())
    assert rule is not None
    name = UNIT_TEMPLATE.format("v0123456789abcdef")
    assert re.fullmatch(rule.group(1), name)
    assert not re.fullmatch(rule.group(1), "sentinel-agent.service")


def test_the_systemd_launcher_starts_the_unit_and_reads_its_verdict(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    workdir = tmp_path / "validate"
    systemctl, log = systemctl_standin(tmp_path, workdir)
    cfg = NodeValidationConfig(launcher="systemd", workdir=workdir, systemctl=str(systemctl))
    validator = NodeValidator("node-7", 1, lambda _: None, cfg=cfg)
    got = validate(validator, {"request_id": "r1", "baseline": baseline, "timeout_s": 120})
    assert got.passed, got.reason
    unit = log.read_text().split()[1]
    assert log.read_text() == f"start {unit}\n" and re.fullmatch(
        r"sentinel-validate@v[0-9a-f]{16}\.service", unit
    )
    assert got.ran.startswith(f"systemd unit {unit} on ")
    assert list(workdir.iterdir()) == []  # the request's folder is removed

    # past the command's timeout: the unit is stopped, and the verdict is a failure
    got = validate(validator, {"request_id": "r2", "baseline": baseline, "timeout_s": 0.5})
    assert not got.passed and "ran past 0.5 s" in got.reason
    assert log.read_text().splitlines()[-1].startswith("stop sentinel-validate@")


def test_the_slurm_launcher_runs_only_in_the_reservation_the_coordinator_holds(
    tmp_path: Path,
) -> None:
    cfg = NodeValidationConfig(launcher="slurm", workdir=tmp_path, srun="/no/such/srun")
    validator = NodeValidator("node-7", 1, lambda _: None, cfg=cfg)
    got = validate(validator, {"request_id": "r1", "baseline": {}, "timeout_s": 10})
    assert not got.passed and "names none (is coordinator.eviction_backend slurm?)" in got.reason
    argv = validator.launch(
        tmp_path, {"launch": {"reservation": "sentinel-validate-node-7"}}, 300
    ).argv
    assert argv[:3] == [
        "/no/such/srun",
        "--reservation=sentinel-validate-node-7",
        "--nodelist=node-7",
    ]
    assert "--time=5" in argv and argv[argv.index("-m") + 1 : argv.index("-m") + 3] == [
        "sentinel",
        "burnin",
    ]


def test_a_launcher_outside_the_agent_needs_a_folder_it_can_see() -> None:
    with pytest.raises(ValidationError, match="outside the agent's private /tmp: set workdir"):
        AgentConfig.model_validate({"validation": {"launcher": "slurm"}})
    with pytest.raises(ValidationError, match="launcher"):
        AgentConfig.model_validate({"validation": {"launcher": "kubernetes"}})
