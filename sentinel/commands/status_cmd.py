"""`sentinel status [--json]`: fleet, jobs, open incidents and playbook runs from a coordinator."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentinel.commands.jsonout import add_json_option, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode, InputError
from sentinel.inputs import read_token

if TYPE_CHECKING:
    from sentinel.status import Client

URL_ENV, TOKEN_ENV = "SENTINEL_COORDINATOR_URL", "SENTINEL_TOKEN"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="fleet, jobs, open incidents and playbook runs, from a coordinator",
        description="Reads the coordinator's HTTP API with an operator (or admin) token. Exit 0 "
        "when nothing is open, 1 when incidents are open, 2 on bad input or a refused token, 3 when "
        "no coordinator answered.",
    )
    add_coordinator_options(p)
    add_json_option(p, "the status")
    p.set_defaults(handler=run)


def coordinator_option(p: argparse.ArgumentParser, where: str, default: str | None = None) -> None:
    """--coordinator: the one option every command that talks to the coordinator takes."""
    p.add_argument(
        "--coordinator",
        metavar="URL[,URL...]",
        default=default,
        help="coordinator URL, e.g. http://127.0.0.1:8470, or several replicas' comma-separated:"
        f" asked in order, the next when one does not answer ({where})",
    )


def add_coordinator_options(p: argparse.ArgumentParser) -> None:
    """--coordinator, --token-file and --timeout: how an operator's command reaches the API."""
    default = os.environ.get(URL_ENV, "http://127.0.0.1:8470")
    coordinator_option(p, f"default: ${URL_ENV} or http://127.0.0.1:8470", default)
    p.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding an operator token (default: ${TOKEN_ENV}; never on the command line)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")


def token_of(args: argparse.Namespace) -> str | None:
    """The operator token: from --token-file, else $SENTINEL_TOKEN."""
    if args.token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    return read_token(args.token_file, "--token-file")


def ask(
    args: argparse.Namespace, work: Callable[[Client], dict[str, Any]]
) -> dict[str, Any] | None:
    """`work` with a client of --coordinator, --token-file and --timeout. InputError (exit 2)
    for a bad URL or a request the coordinator refused; None, said on stderr, when no
    coordinator could be asked."""
    from sentinel.status import Client, StatusError

    try:
        client = Client(args.coordinator, token_of(args), args.timeout)
    except ValueError as e:
        raise InputError(f"--coordinator: {e}") from None
    try:
        return work(client)
    except StatusError as e:
        if e.bad_input:
            raise InputError(str(e)) from None
        print(f"sentinel: {e}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sentinel.status import gather, render

    doc = ask(args, gather)
    if doc is None:  # unreachable: not the same answer as "incidents are open"
        return ExitCode.UNAVAILABLE
    emit_json(args, doc)
    if not json_to_stdout(args):
        render(doc, Console())
    return ExitCode.PROBLEM_FOUND if doc["incidents_open"] else ExitCode.OK
