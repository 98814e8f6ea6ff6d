"""A systemd unit's sandbox, applied to a command without systemd (this machine runs none).

What it applies, from the unit file itself:
- the capabilities a process of the unit holds: its `AmbientCapabilities` within its
  `CapabilityBoundingSet` (what a non-root `User=` keeps), less `CAP_SYSLOG` under
  `ProtectKernelLogs=yes`; the command runs as uid 0 holding exactly those (`setpriv
  --bounding-set`), so a capability the unit lacks is lacking here too;
- `NoNewPrivileges=` (`setpriv --no-new-privs`);
- the kernel log's device node: hidden, as `ProtectKernelLogs=yes` hides it, and as a closed
  `DevicePolicy=` does for a node no `DeviceAllow=` names: in a private mount namespace
  (`unshare -m`) an inaccessible file (mode 0) is mounted over /dev/kmsg.

What it does not apply: `User=` itself (the checkout may sit where only root reads it; uid 0
without `CAP_DAC_OVERRIDE` reads no more of /dev/kmsg than that user would), the device cgroup
for other nodes, the memory and CPU limits, the system-call and address-family filters and the
read-only file system views. None of them decides whether a source can be read here.
"""

from __future__ import annotations

from pathlib import Path

KMSG = "/dev/kmsg"
# A closed policy's standard pseudo devices (systemd.resource-control(5)); /dev/kmsg is not one.
_CLOSED = {"closed", "strict"}


def unit_settings(text: str) -> dict[str, list[str]]:
    """The unit's `Key=value` lines, every value of a key in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _caps(settings: dict[str, list[str]], key: str) -> set[str]:
    return {c.removeprefix("CAP_").lower() for v in settings.get(key, []) for c in v.split()}


def held_capabilities(settings: dict[str, list[str]]) -> set[str]:
    """What a process of the unit running as a non-root user holds (setpriv's names)."""
    held = _caps(settings, "AmbientCapabilities")
    if "CapabilityBoundingSet" in settings:
        held &= _caps(settings, "CapabilityBoundingSet")
    if _yes(settings, "ProtectKernelLogs"):
        held.discard("syslog")
    return held


def kmsg_hidden(settings: dict[str, list[str]]) -> bool:
    if _yes(settings, "ProtectKernelLogs"):
        return True
    policy = (settings.get("DevicePolicy") or ["auto"])[-1]
    allowed = [v.split()[0] for v in settings.get("DeviceAllow", []) if v.strip()]
    return policy in _CLOSED and KMSG not in allowed


def _yes(settings: dict[str, list[str]], key: str) -> bool:
    return (settings.get(key) or ["no"])[-1].strip() in {"yes", "true", "1", "on"}


def sandbox_prefix(settings: dict[str, list[str]], scratch: Path) -> list[str]:
    """The command line to put before a command to run it under the unit's sandbox."""
    caps = ",".join(["-all", *(f"+{c}" for c in sorted(held_capabilities(settings)))])
    setpriv = ["setpriv", f"--bounding-set={caps}", "--inh-caps=-all"]
    if _yes(settings, "NoNewPrivileges"):
        setpriv.append("--no-new-privs")
    mounts = ""
    if kmsg_hidden(settings):
        blocked = scratch / "inaccessible"
        blocked.touch(mode=0)
        blocked.chmod(0)
        mounts = f"mount --bind {blocked} {KMSG} && "
    shell = f'{mounts}exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh", *setpriv]
