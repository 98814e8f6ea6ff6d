"""Entry point of one burn-in rank: `python -m sentinel.burnin.worker SETTINGS_JSON_FILE`.

The launcher (the simulated-fleet spawner, or a namespace test) sets the usual torch.distributed
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and SENTINEL_NODE; rank 0 writes the
report to the settings' `result_path`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sentinel.burnin.runner import run_rank
from sentinel.burnin.settings import BurninSettings


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sentinel.burnin.worker SETTINGS_JSON_FILE", file=sys.stderr)
        return 2
    run_rank(BurninSettings.from_json(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
