"""`sentinel config check FILE`: validate a configuration file and print every error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentinel.commands.jsonout import add_json_option, emit_json
from sentinel.exitcodes import ExitCode


def register(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = config_sub.add_parser(
        "check", help="validate a config file (with SENTINEL_* overrides); exit 2 on errors"
    )
    check.add_argument("file", type=Path, help="config file to validate (YAML or TOML)")
    add_json_option(check, "the effective config")
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
        emit_json(args, cfg.model_dump(mode="json"))
    else:
        print(f"{args.file}: ok")
    return ExitCode.OK
