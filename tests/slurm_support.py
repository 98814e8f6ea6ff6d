"""Starting a real Slurm cluster in tests: a missing package fails with the command that
installs it; no root skips (in CI, always root, the skip policy makes that a failure)."""

from __future__ import annotations

from system_deps import require_command, require_root

from sentinel.lab.slurm.cluster import missing_requirements

_COMMANDS = {
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "munged": "munge",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "ip": "iproute2",
}


def require_cluster() -> None:
    require_root("a Slurm cluster of network namespaces, slurmd and munged")
    for command, package in _COMMANDS.items():
        require_command(command, package)
    why = missing_requirements()
    assert why is None, why
