"""`sentinel` command line. Each subcommand lives in its own module with a `register` function.

Exit codes everywhere: 0 ok, 1 the check found a problem, 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from sentinel import __version__
from sentinel.exitcodes import ExitCode, InputError
from sentinel.logs import setup_logging

# Modules that add subcommands; each defines `register(subparsers)` and sets `handler`. They
# import their machinery inside the handler, so `sentinel agent` never loads burn-in's torch.
COMMAND_MODULES = (
    "sentinel.commands.config_cmd",
    "sentinel.commands.agent_cmd",
    "sentinel.commands.dashboards_cmd",
    "sentinel.commands.coordinator_cmd",
    "sentinel.commands.playbooks_cmd",
    "sentinel.commands.token_cmd",
    "sentinel.commands.run_cmd",
    "sentinel.commands.goodput_cmd",
    "sentinel.commands.fr_cmd",
    "sentinel.commands.burnin_cmd",
    "sentinel.commands.demo_cmd",
    "sentinel.commands.status_cmd",
    "sentinel.commands.fleet_cmd",
    "sentinel.commands.stacks_cmd",
    "sentinel.commands.incident_cmd",
    "sentinel.commands.rules_cmd",
)

log = logging.getLogger("sentinel")
Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's default already exits 2; keep the text
        self.print_usage(sys.stderr)
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sentinel",
        description="Observability and reliability for GPU training fleets.",
    )
    parser.add_argument("--version", action="version", version=f"sentinel {__version__}")
    add_log_options(parser, default=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for sub_parser in _subparsers(parser):
        # After the subcommand too; SUPPRESS leaves a value given before it in place.
        add_log_options(sub_parser, default=argparse.SUPPRESS)
    return parser


def add_log_options(parser: argparse.ArgumentParser, default: object) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=default,
        help="log lines on stderr as text (default) or one JSON object each",
    )
    group.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default,
        help="least severe level logged (default: info)",
    )


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subparsers(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format or "text", args.log_level or "info")
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        return int(handler(args))
    except InputError as e:
        print(f"sentinel: {e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except (OSError, UnicodeError) as e:  # what a command met without a message of its own
        print(f"sentinel: {system_error(e)}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        return 130


def system_error(e: OSError | UnicodeError) -> str:
    """One line for an operating-system or decoding error: the file it names, if any, and
    what is wrong, never a traceback."""
    if isinstance(e, UnicodeDecodeError):
        return f"an input is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if isinstance(e, OSError) and e.filename is not None:
        also = f" -> {e.filename2}" if e.filename2 is not None else ""
        return f"{e.filename}{also}: {e.strerror or e}"
    return str(e)
