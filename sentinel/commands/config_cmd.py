"""`sentinel config check FILE`: validate a configuration file and print every error."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sentinel.exitcodes import ExitCode


def register(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = config_sub.add_parser(
        "check", help="validate a config file (with SENTINEL_* overrides); exit 2 on errors"
    )
    check.add_argument("file", type=Path)
    check.add_argument("--json", action="store_true", help="print the effective config as JSON")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    from sentinel.config import ConfigError, load_config

    try:
        cfg = load_config(args.file)
    except ConfigError as e:
        print(f"{args.file}: {len(e.errors)} error(s)", file=sys.stderr)
        for line in e.errors:
            print(f"  {line}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.json:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
    else:
        print(f"{args.file}: ok")
    return ExitCode.OK
