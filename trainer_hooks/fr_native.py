"""The flight-recorder dump that needs no GIL (`fr_native.cpp`), built at first use.

A rank wedged in a C call that holds the GIL cannot run the hooks' Python dump, which is when
its recorder matters most. The native helper is a thread of plain C++ that calls PyTorch's own
recorder dump (without stack traces: symbolizing Python frames is what needs the GIL) whenever
a byte arrives on a FIFO the rank creates beside its beacon; the node's agent writes that byte
for every `fr.dump` it relays.

The helper is compiled once per machine with the system's C++ compiler into a cache directory
(`SENTINEL_CACHE_DIR`, else `$XDG_CACHE_HOME/sentinel`, else `~/.cache/sentinel`), under a name
that carries the source's digest, as PyTorch builds its own JIT extensions. It links against
no torch: it finds the dump function in the running process. Where it cannot be built or
loaded, the rank goes without it and says why once; the Python dump still answers every
command a rank with a free GIL hears.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

from sentinel.beacon import FR_QUIT, poke_fr

log = logging.getLogger("trainer_hooks.flight")

SOURCE = Path(__file__).with_name("fr_native.cpp")
_START_ERRORS = {-1: "libtorch_cpu is not loaded", -2: "this torch has no c10d::dump_fr_trace"}
_BUILD_TIMEOUT_S = 120.0

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_unavailable: str | None = None


def cache_dir() -> Path:
    explicit = os.environ.get("SENTINEL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sentinel"


def _build(out: Path) -> None:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise OSError("no C++ compiler (c++ or g++) to build it with")
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-pthread", "-o", str(tmp)]
    try:
        done = subprocess.run(
            [*cmd, str(SOURCE), "-ldl"], capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S
        )
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-400:]}")
        os.replace(tmp, out)  # ranks building at once each rename a whole library
    finally:
        tmp.unlink(missing_ok=True)


def library() -> ctypes.CDLL | None:
    """The helper, built if this machine has none yet; None (and why, once) if it cannot be."""
    global _library, _unavailable
    with _lock:
        if _library is not None or _unavailable is not None:
            return _library
        digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
        path = cache_dir() / f"fr_native-{digest}.so"
        try:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                with (path.parent / "fr_native.lock").open("a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # the ranks of a node build it once
                    if not path.exists():
                        _build(path)
            lib = ctypes.CDLL(str(path))
        except (OSError, subprocess.TimeoutExpired) as e:
            _unavailable = str(e)
            log.warning("no GIL-free flight-recorder dump in this rank: %s", e)
            return None
        lib.sentinel_fr_native_start.argtypes = [ctypes.c_char_p] * 4
        lib.sentinel_fr_native_start.restype = ctypes.c_int
        _library = lib
        return lib


class NativeDumper:
    """One rank's FIFO and the helper thread parked on it, until `close`."""

    def __init__(self, fifo: Path, dump_path: Path, sidecar_path: Path, sidecar: str) -> None:
        self.fifo = fifo
        lib = library()
        if lib is None:
            raise OSError(_unavailable or "the helper could not be loaded")
        fifo.unlink(missing_ok=True)  # a dead process of the same pid left it
        os.mkfifo(fifo)
        # The node's agent may run as a user of its own (the shipped unit's `sentinel`): it
        # must be able to write. Anyone who can is heard at most once a second.
        os.chmod(fifo, 0o622)
        code = lib.sentinel_fr_native_start(
            str(fifo).encode(),
            str(dump_path).encode(),
            str(sidecar_path).encode(),
            sidecar.encode(),
        )
        if code != 0:
            fifo.unlink(missing_ok=True)
            raise OSError(_START_ERRORS.get(code, f"the helper did not start ({code})"))

    def close(self) -> None:
        """End the helper's thread (a quit byte) and remove the FIFO."""
        poke_fr(self.fifo, FR_QUIT)
        self.fifo.unlink(missing_ok=True)
