"""What a test needs from the system, and what happens when it is missing.

A missing Debian package is a failure that names the command to install it, never a quiet skip:
`make test` (and .ci/run) run scripts/install-system-deps.sh, which installs them as root and
prints this same command otherwise.
"""

from __future__ import annotations

import os
import shutil

import pytest

INSTALL_SCRIPT = "scripts/install-system-deps.sh"


def install_hint(package: str) -> str:
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get install -y {package}  (or: {sudo}{INSTALL_SCRIPT})"


def require_command(command: str, package: str) -> str:
    """The command's path; fails the test with the install command when it is not installed."""
    path = shutil.which(command)
    if path is None:
        pytest.fail(
            f"`{command}` is not installed (Debian package {package}): {install_hint(package)}"
        )
    return path


def require_root(why: str) -> None:
    """Skips without root; in CI (CI=true, always root) the skip policy turns that into a failure."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {why}")
