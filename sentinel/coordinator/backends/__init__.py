"""Eviction backends: how a node is taken out of service where the scheduler looks. Effects
(`core/effects.py`) are their only caller; the runtime makes the one the config names."""

from __future__ import annotations

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.backends.exclude_file import ExcludeFileBackend
from sentinel.coordinator.backends.kubernetes import KubernetesBackend
from sentinel.coordinator.backends.slurm import SlurmBackend
from sentinel.coordinator.core.effects import EvictionBackend


def make_backend(cfg: CoordinatorConfig) -> EvictionBackend:
    """The backend `coordinator.eviction_backend` names."""
    if cfg.eviction_backend == "slurm":
        return SlurmBackend(cfg.scontrol, cfg.scontrol_timeout_s, cfg.slurm_validation_user)
    if cfg.eviction_backend == "kubernetes":
        token = cfg.kubernetes_token_file.read_text().strip() if cfg.kubernetes_token_file else None
        return KubernetesBackend(cfg.kubernetes_api, token, cfg.kubernetes_taint_key)
    return ExcludeFileBackend(cfg.exclude_file or cfg.state_dir / "exclude.txt")
