#!/usr/bin/env python3
"""A stand-in `scontrol` (no Slurm controller runs in these tests): `update NodeName=N
State=DRAIN ...`, `show node N` and `show node --oneliner` (every node it drained), with the
node states kept in a JSON file.

It is the backend's own record, the witness a test reads: every call is appended to
`$SCONTROL_STATE.log` ("update N", "drained N", "show N", "show all"). `SCONTROL_UPDATE_SLEEP_S` makes an
update take that long before the drain lands, as a slow controller would.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

STATE = Path(os.environ["SCONTROL_STATE"])


def log(line: str) -> None:
    with open(f"{STATE}.log", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


REASONS = Path(f"{STATE}.reasons")


def drain(node: str, reason: str) -> None:
    with open(f"{STATE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        states = json.loads(STATE.read_text()) if STATE.exists() else {}
        states[node] = "IDLE+DRAIN"
        STATE.write_text(json.dumps(states))
        reasons = json.loads(REASONS.read_text()) if REASONS.exists() else {}
        reasons[node] = reason
        REASONS.write_text(json.dumps(reasons))


def main(argv: list[str]) -> int:
    args = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    if argv[:1] == ["update"] and args.get("State") == "DRAIN":
        node = args["NodeName"]
        log(f"update {node}")
        time.sleep(float(os.environ.get("SCONTROL_UPDATE_SLEEP_S", "0")))
        drain(node, args.get("Reason", ""))
        log(f"drained {node}")
        return 0
    if argv == ["show", "node", "--oneliner"]:  # every node it holds (the scheduler bridge)
        log("show all")
        states = json.loads(STATE.read_text()) if STATE.exists() else {}
        reasons = json.loads(REASONS.read_text()) if REASONS.exists() else {}
        for node, state in sorted(states.items()):
            print(f"NodeName={node} Arch=x86_64 State={state} Reason={reasons.get(node, '')}")
        return 0
    if argv[:2] == ["show", "node"] and len(argv) == 3:
        node = argv[2]
        log(f"show {node}")
        states = json.loads(STATE.read_text()) if STATE.exists() else {}
        print(f"NodeName={node} Arch=x86_64 CoresPerSocket=1\n   State={states.get(node, 'IDLE')}")
        return 0
    print(f"scontrol stand-in: unsupported call {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
