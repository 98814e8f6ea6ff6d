"""The hooks' settings: one frozen object, read from the environment once, at the edge.

Every field `x` can be set with `SENTINEL_HOOKS_X` (e.g. `SENTINEL_HOOKS_REPORT_EVERY=20`);
identity comes from the launcher's usual variables: `SENTINEL_AGENT_SOCKET`, `SENTINEL_NODE`,
`SENTINEL_JOB`, and `RANK` / `WORLD_SIZE` (torchrun) when torch.distributed is not up yet.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentinel.faults.catalog import STRAGGLER


class HooksConfigError(ValueError):
    pass


SDC_EVERY_EXCHANGES = 5  # the default SDC spot check: every fifth gang exchange


@dataclass(frozen=True)
class HooksConfig:
    enabled: bool = True
    agent_socket: str | None = None
    node: str | None = None
    job: str | None = None
    # Metrics: a `rank.step` event every N steps.
    report_every: int = 10
    peak_flops: float | None = None  # overrides the GPU table / the CPU GEMM measurement
    flops_per_token: float | None = None
    instrument_collectives: bool = True
    # Anomalies: spike policy "robust" (default), "megatron", "olmo" or "zclip".
    anomaly_policy: str = "robust"
    # Gang exchange (stragglers, SDC and checkpoint consensus) every N steps on a gloo side group.
    exchange_every: int = 20
    # Stragglers (trainer_hooks.straggler): a rank whose own compute, over its peers', runs
    # `threshold` times its own normal (its ratio over its first `baseline` windows, then over
    # its unflagged windows up to `history` of them, counted as 1.0 to `baseline_max`) in `over`
    # of its last `persist` windows of `window` steps, or over those windows' steps pooled while
    # none of them reaches the catalog's `acted_on`.
    straggler_threshold: float = STRAGGLER.named
    straggler_persist: int = 4
    straggler_over: int = 3
    straggler_window: int = 20
    straggler_baseline: int = 4
    straggler_baseline_max: float = 1.10
    straggler_history: int = 25
    # Steps between SDC spot checks (a multiple of exchange_every); 0: on command only; unset:
    # every fifth exchange (100 steps at the defaults). A check costs a small GEMM chain and
    # a digest per rank, gathered without waiting; silent corruption is caught within it.
    sdc_every: int | None = None
    sdc_size: int = 256
    sdc_chain: int = 8
    sdc_params: bool = True  # compare parameter digests across data-parallel replicas
    # Hang watchdog.
    hang_k: float = 5.0
    hang_floor_s: float = 60.0
    hang_first_step_s: float = 900.0
    watchdog_poll_s: float = 1.0
    # Flight recorder.
    fr_dir: str | None = None
    fr_prefix: str = "fr_trace_rank_"
    fr_on_signal: bool = True

    def __post_init__(self) -> None:
        for name in (
            "report_every",
            "exchange_every",
            "straggler_persist",
            "straggler_over",
            "straggler_window",
            "straggler_baseline",
            "sdc_size",
            "sdc_chain",
        ):
            if getattr(self, name) < 1:
                raise HooksConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sdc_every is None:
            object.__setattr__(self, "sdc_every", SDC_EVERY_EXCHANGES * self.exchange_every)
        assert self.sdc_every is not None
        if self.sdc_every < 0 or self.sdc_every % self.exchange_every:
            raise HooksConfigError(
                f"sdc_every ({self.sdc_every}) must be 0 or a multiple of exchange_every "
                f"({self.exchange_every})"
            )
        if self.straggler_threshold <= 1.0:
            raise HooksConfigError("straggler_threshold is a slowdown ratio and must be > 1")
        if self.straggler_over > self.straggler_persist:
            raise HooksConfigError(
                f"straggler_over ({self.straggler_over}) counts windows of the last "
                f"straggler_persist ({self.straggler_persist}) and cannot exceed it"
            )
        if self.straggler_history < self.straggler_baseline:
            raise HooksConfigError(
                f"straggler_history ({self.straggler_history}) counts the windows of a rank's "
                f"normal, its first straggler_baseline ({self.straggler_baseline}) among them"
            )
        if self.straggler_baseline_max < 1.0:
            raise HooksConfigError("straggler_baseline_max is a ratio and must be >= 1")
        if self.hang_k <= 0 or self.hang_floor_s <= 0 or self.hang_first_step_s <= 0:
            raise HooksConfigError("hang_k, hang_floor_s and hang_first_step_s must be > 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> HooksConfig:
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "agent_socket": env.get("SENTINEL_AGENT_SOCKET") or None,
            "node": env.get("SENTINEL_NODE") or None,
            "job": env.get("SENTINEL_JOB") or None,
        }
        for f in dataclasses.fields(cls):
            raw = env.get(f"SENTINEL_HOOKS_{f.name.upper()}")
            if raw is not None:
                values[f.name] = _parse(f.name, str(f.type), raw)
        values.update(overrides)
        return cls(**values)


def _parse(name: str, type_name: str, raw: str) -> Any:
    if raw == "" and "None" in type_name:
        return None
    try:
        if type_name.startswith("bool"):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
    except ValueError:
        raise HooksConfigError(
            f"SENTINEL_HOOKS_{name.upper()}={raw!r} is not a valid {type_name}"
        ) from None
    return raw
