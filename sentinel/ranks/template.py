"""`python -m sentinel.ranks.template -- TRAINER_ARGV...`: the simulated fleet's node hosts,
forked from one process.

On a real fleet every node runs its own node host (`sentinel.ranks.host`), which imports the
trainer once for that node. The simulated fleet puts every node on this machine, where a started
host per node imports torch once per node: about 2 s of a core each, nine of them before the
default drill's first step, on two cores. The template imports the trainer once and forks each
node's host when asked: a forked host is the same program as a started one (its own session,
log, environment and pool connection), with the import done.

One JSON object per line: the launcher writes `{"node", "connect", "env", "log"}` to the
template's stdin; the template forks that node's host and answers `{"node", "pid"}` on its
stdout. When its stdin closes (the launcher is done, or gone) it kills every host it forked
and ends.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sentinel.processes import fork_child, redirect_output
from sentinel.ranks import wire
from sentinel.ranks.host import die_with_parent, import_trainer, run_host, trainer_after_dashes


def _host(request: dict[str, Any], module: str, args: list[str]) -> int:
    """In the forked child: the node's host, as `python -m sentinel.ranks.host` runs it."""
    os.setsid()  # its own process group, with the rank processes it forks, as a started host
    die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)  # the template's requests are not the host's
    os.dup2(devnull, 0)
    os.close(devnull)
    if request.get("log"):
        redirect_output(Path(request["log"]))
    os.environ.clear()
    os.environ.update(request["env"])
    secret = os.environ.pop(wire.SECRET_ENV, "")
    return run_host(request["connect"], secret, request["node"], module, args)


def serve(module: str, args: list[str]) -> int:
    hosts: set[int] = set()

    def reap(*_: object) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            hosts.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            pid = fork_child(functools.partial(_host, request, module, args))
            hosts.add(pid)
            print(json.dumps({"node": request["node"], "pid": pid}), flush=True)
    finally:
        for pid in list(hosts):
            for kill in (os.killpg, os.kill):  # its group, or itself before its setsid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sentinel.ranks.template", description=__doc__)
    p.add_argument("trainer", nargs=argparse.REMAINDER, help="-- TRAINER_ARGV...")
    try:
        module, args = trainer_after_dashes(p.parse_args(argv).trainer)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # No parent-death signal here: it fires when the launcher's thread that started the template
    # ends, not the launcher. The launcher's end closes the template's stdin, which ends it.
    import_trainer(module)
    return serve(module, args)


if __name__ == "__main__":
    sys.exit(main())
