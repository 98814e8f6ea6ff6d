"""`sentinel dashboards push`: create or update Sentinel's Grafana dashboards, idempotently."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlparse

from sentinel.commands.jsonout import add_json_option, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode, InputError
from sentinel.inputs import read_json

TOKEN_ENV = "SENTINEL_GRAFANA_TOKEN"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboards", help="Grafana dashboards")
    psub = p.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)
    push = psub.add_parser(
        "push",
        help="create or update the dashboards in Grafana (same uid: overwrite, never duplicate)",
        description="Create the folder if missing, then create or update every dashboard. "
        "Needs the `ops` extra (grafana-client).",
    )
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. https://grafana:3000")
    push.add_argument(
        "--token",
        help=f"service account token (Editor); default: ${TOKEN_ENV}, which keeps it out of ps",
    )
    push.add_argument("--folder", default="Sentinel", help="folder name (default: Sentinel)")
    push.add_argument(
        "--dir",
        type=Path,
        help="push the *.json dashboards in DIR instead of the ones built into Sentinel",
    )
    push.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    add_json_option(push, "what was pushed")
    push.set_defaults(handler=run_push)
    textfile = psub.add_parser(
        "burnin-textfile",
        help="a burn-in report as Prometheus text for node_exporter's textfile collector",
        description="Read a `sentinel burnin --json` report and write the sentinel_burnin_* "
        "series the burn-in dashboard shows. The report's modification time is the run's time.",
    )
    textfile.add_argument("report", type=Path, help="burn-in JSON report")
    textfile.add_argument(
        "--out",
        type=Path,
        help="file to write atomically, e.g. /var/lib/node_exporter/textfile/sentinel_burnin.prom "
        "(default: stdout)",
    )
    textfile.set_defaults(handler=run_burnin_textfile)


def root_cause(e: BaseException) -> str:
    """The innermost cause in words. requests and urllib3 wrap it in layers whose text carries
    the reprs of their pool and connection objects (`HTTPConnectionPool(host=...)`,
    `<urllib3.connection.HTTPConnection object at 0x...>`): an operator needs the last part."""
    while True:
        inner = getattr(e, "reason", None)
        if not isinstance(inner, BaseException) and e.args and isinstance(e.args[0], BaseException):
            inner = e.args[0]
        if not isinstance(inner, BaseException):
            inner = e.__cause__
        if inner is None or inner is e:
            break
        e = inner
    text = re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>: ", "", str(e))
    return re.sub(r"^\w*ConnectionPool\([^)]*\): ", "", text) or type(e).__name__


def _check_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError(f"--url must be an http(s) URL with a host, got {url!r}")
    try:
        parsed.port  # noqa: B018  (raises on a malformed port)
    except ValueError as e:
        raise InputError(f"--url {url!r}: {e}") from None


def _dashboards(directory: Path | None) -> dict[str, dict]:
    from sentinel.dashboards import build_all, load_dir

    if directory is None:
        return build_all()
    if not directory.is_dir():
        raise InputError(f"--dir {directory}: not a directory")
    try:
        found = load_dir(directory)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"--dir {directory}: {e}") from None
    if not found or not all(isinstance(d, dict) and d.get("uid") for d in found.values()):
        raise InputError(f"--dir {directory}: no dashboard JSON files with a uid")
    return found


def run_push(args: argparse.Namespace) -> int:
    _check_url(args.url)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    dashboards = _dashboards(args.dir)
    try:
        from grafana_client import GrafanaApi
        from grafana_client.client import (
            GrafanaClientError,
            GrafanaException,
            GrafanaUnauthorizedError,
        )
    except ImportError:
        raise InputError(
            "grafana-client is not installed: pip install 'sentinel-gpu[ops]'"
        ) from None
    from sentinel.dashboards.grafana import push

    api = GrafanaApi.from_url(args.url, credential=token, timeout=args.timeout)
    try:
        pushed = push(api, dashboards, args.folder, client_error=GrafanaClientError)
    except GrafanaUnauthorizedError:
        how = "the token was refused" if token else f"no token given (--token or ${TOKEN_ENV})"
        raise InputError(f"Grafana at {args.url} answered 401 Unauthorized: {how}") from None
    except GrafanaClientError as e:
        print(f"sentinel: Grafana at {args.url} refused the request: {e}", file=sys.stderr)
        return ExitCode.PROBLEM_FOUND
    except (GrafanaException, OSError) as e:
        print(f"sentinel: cannot reach Grafana at {args.url}: {root_cause(e)}", file=sys.stderr)
        return ExitCode.PROBLEM_FOUND
    emit_json(args, [asdict(p) for p in pushed])
    if not json_to_stdout(args):
        for p in pushed:
            print(f"{p.action:8} {p.title}  (uid {p.uid}, version {p.version}) {p.url}")
        print(f"{len(pushed)} dashboards in folder {args.folder!r} at {args.url}")
    return ExitCode.OK


def run_burnin_textfile(args: argparse.Namespace) -> int:
    from sentinel.dashboards.burnin_metrics import ReportError, exposition, write_textfile

    if args.out is not None and not args.out.parent.is_dir():
        what = "is not a directory" if args.out.parent.exists() else "does not exist"
        raise InputError(f"--out {args.out}: {args.out.parent} {what}")
    report = read_json(args.report, "a burn-in report: sentinel burnin --report")
    try:
        body = exposition(report, args.report.stat().st_mtime)
    except (OSError, ReportError) as e:
        raise InputError(f"{args.report}: {e}") from None
    if args.out is None:
        sys.stdout.write(body.decode())
        return ExitCode.OK
    write_textfile(args.out, body)
    return ExitCode.OK
