"""How many GPUs this node should have: from config, or from the PCI bus.

NVML lists the GPUs the driver could bring up; one that fell off the bus or failed to
initialise is simply not there. The PCI bus still shows the device (the kernel enumerates it
before any driver), so the count of NVIDIA display controllers under /sys/bus/pci/devices is
the node's expected GPU count. NVSwitches and NVIDIA's other bridges share the vendor id but
not the class, so they do not count. The root is a parameter: tests point it at a fake tree.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("sentinel.agent")

NVIDIA_VENDOR = 0x10DE
DISPLAY_CLASS = 0x03  # PCI base class 03: VGA (0300) and 3D (0302) controllers
PCI_DEVICES = Path("/sys/bus/pci/devices")


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def pci_gpus(root: Path = PCI_DEVICES) -> list[str]:
    """Bus ids of NVIDIA display-class PCI devices under `root`, sorted."""
    try:
        devices = sorted(root.iterdir())
    except OSError as e:
        log.warning("cannot list %s (%s): expected GPUs unknown", root, e.strerror)
        return []
    return [
        dev.name
        for dev in devices
        if _hex(dev / "vendor") == NVIDIA_VENDOR
        and (_hex(dev / "class") or 0) >> 16 == DISPLAY_CLASS
    ]


def expected_gpus(configured: int | None, root: Path = PCI_DEVICES) -> int | None:
    """The configured count, else the PCI count; None when neither knows (no NVIDIA device)."""
    if configured is not None:
        return configured
    found = pci_gpus(root)
    return len(found) or None
