import subprocess
from pathlib import Path

import pytest

from sentinel.config import ConfigError, SentinelConfig, load_config


def test_defaults_work_without_a_file() -> None:
    cfg = load_config(None, env={})
    assert cfg.agent.interval_s == 1.0
    assert cfg.log.format == "text"


def test_yaml_and_toml_give_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("agent:\n  interval_s: 2.5\n  node_id: node-3\n")
    (tmp_path / "a.toml").write_text('[agent]\ninterval_s = 2.5\nnode_id = "node-3"\n')
    assert load_config(tmp_path / "a.yaml", env={}) == load_config(tmp_path / "a.toml", env={})


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("agent:\n  interval_s: 2.5\n")
    env = {
        "SENTINEL_AGENT__INTERVAL_S": "0.5",
        "SENTINEL_AGENT__THRESHOLDS__GPU_TEMP_DEGRADED_C": "80",
        "SENTINEL_RANK_SOCKET": "/tmp/ignored-not-a-config-field",
    }
    cfg = load_config(tmp_path / "a.yaml", env=env)
    assert cfg.agent.interval_s == 0.5
    assert cfg.agent.thresholds.gpu_temp_degraded_c == 80


def test_every_error_is_reported_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  interval_s: -1\n  intervl: 3\nlog: {format: xml}\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad, env={})
    joined = "\n".join(err.value.errors)
    assert "agent.interval_s: Input should be greater than 0 (got -1)" in joined
    assert "agent.intervl: Extra inputs are not permitted" in joined
    assert "log.format:" in joined
    assert len(err.value.errors) == 3


def test_a_typo_in_an_env_override_is_an_error() -> None:
    with pytest.raises(
        ConfigError, match=r"agent\.intervl_s \(from \$SENTINEL_AGENT__INTERVL_S\): Extra"
    ):
        load_config(None, env={"SENTINEL_AGENT__INTERVL_S": "2"})


def test_config_check_cli(tmp_path: Path, sentinel_cmd: list[str]) -> None:
    good, bad, broken = tmp_path / "g.yaml", tmp_path / "b.yaml", tmp_path / "x.yaml"
    good.write_text("agent: {interval_s: 2}\n")
    bad.write_text("agent: {interval_s: fast}\n")
    broken.write_text("agent: [\n")
    ok = subprocess.run([*sentinel_cmd, "config", "check", str(good)], capture_output=True)
    assert ok.returncode == 0
    res = subprocess.run(
        [*sentinel_cmd, "config", "check", str(bad)], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "agent.interval_s: Input should be a valid number" in res.stderr
    res = subprocess.run(
        [*sentinel_cmd, "config", "check", str(broken)], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert f"{broken}:2:1: not valid YAML" in res.stderr


def test_cli_basics(sentinel_cmd: list[str]) -> None:
    assert subprocess.run([*sentinel_cmd, "--version"], capture_output=True).returncode == 0
    assert subprocess.run([*sentinel_cmd, "--help"], capture_output=True).returncode == 0
    assert subprocess.run([*sentinel_cmd, "no-such"], capture_output=True).returncode == 2


def test_a_typo_in_an_env_section_is_an_error() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"SENTINEL_AGNET__INTERVAL_S": "2", "SENTINEL_JOB": "llm"})
    sections = ", ".join(sorted(SentinelConfig.model_fields))
    assert e.value.errors == [
        f"SENTINEL_AGNET__INTERVAL_S: no config section 'agnet' (sections: {sections})"
    ]


def test_a_bad_env_value_is_blamed_on_the_variable(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("agent: {interval_s: 2}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, env={"SENTINEL_AGENT__INTERVAL_S": "fast"})
    assert str(e.value).startswith("environment: invalid configuration:")
    assert "agent.interval_s (from $SENTINEL_AGENT__INTERVAL_S): Input should be" in str(e.value)


def test_costly_reads_must_come_at_least_twice_a_rate_window(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  costly_reads_interval_s: 200\n")  # the window is 300 s
    with pytest.raises(ConfigError) as err:
        load_config(bad, env={})
    (error,) = err.value.errors
    assert "costly_reads_interval_s (200) must be at most half" in error, error
    ok = tmp_path / "ok.yaml"
    ok.write_text("agent:\n  costly_reads_interval_s: 2\n  thresholds: {rate_window_s: 4}\n")
    assert load_config(ok, env={}).agent.costly_reads_interval_s == 2
