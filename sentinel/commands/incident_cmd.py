"""`sentinel incident ack|approve|resolve ID` and `sentinel incident act ID ACTION`: an
operator's hand on an incident from the command line, through the coordinator's API (the same
roles, rails and audit as `POST /v1/incidents/{id}/...` and `POST /v1/actions`); `sentinel
incident bundle ID`: its evidence bundle, as one archive (`GET /v1/incidents/{id}/bundle`)."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sentinel.commands.jsonout import add_json_option, check_json_target, emit_json, json_to_stdout
from sentinel.commands.status_cmd import add_coordinator_options, ask
from sentinel.exitcodes import ExitCode, InputError

if TYPE_CHECKING:
    from sentinel.status import Client

VERBS = {
    "ack": ("acknowledge", "acknowledge an incident: a person is on it"),
    "approve": ("approve", "approve a run awaiting approval, or an escalated one"),
    "resolve": ("resolve", "resolve an incident; its runs are cancelled"),
}
# What the coordinator answers a request it refuses (not found, wrong state, bad params, the
# token's role): the request was wrong, exit 2.
REFUSED = (400, 401, 403, 404, 409, 422)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "incident",
        help="acknowledge, approve or resolve an incident, or run an action on it by hand",
        description="An operator's hand on an incident through the coordinator's API (operator "
        "or admin token; every act is audited under the token's name). Exit 0 when the "
        "coordinator took it, 2 when it refused it (no such incident, a state that forbids it, "
        "bad parameters, the token's role), 3 when no coordinator answered.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, (_path, text) in VERBS.items():
        v = verbs.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        _common(v)
    act = verbs.add_parser(
        "act",
        help="run one action on an incident by hand (return_node, evict_node, rollback, ...)",
        description="Queue a one-step run of ACTION on the incident; the coordinator runs it "
        "like a playbook step, with the same rails. Returning an evicted node: `sentinel "
        "incident act ID return_node --param node=NODE --why 'repaired: new GPU'`.",
    )
    _common(act)
    act.add_argument("action", metavar="ACTION", help="a catalog action, e.g. return_node")
    act.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an action parameter (repeatable); VALUE is read as YAML: 3, true, [a, b]",
    )
    act.add_argument("--why", required=True, help="the reason, kept in the audit trail")
    bundle = verbs.add_parser(
        "bundle",
        help="write the incident's evidence bundle (one tar.gz) to a file",
        description="Fetch the incident's evidence bundle: the ranks' flight-recorder dumps "
        "and stacks, its nodes' evidence (NVML snapshot, XID history, kernel-log tail, "
        "verdicts) and its timeline, with a manifest of what was captured and what was "
        "missing. The archive is checked against the sha256 the coordinator sealed it under; "
        "an existing file is never overwritten with other bytes.",
    )
    _common(bundle)
    bundle.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="PATH",
        help="where to write it (default: incident-ID-SHA.tar.gz here)",
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", type=int, metavar="ID", help="the incident's number")
    add_coordinator_options(p)
    add_json_option(p, "the coordinator's answer")
    p.set_defaults(handler=run)


def params_of(pairs: list[str]) -> dict[str, Any]:
    """`--param KEY=VALUE` pairs as the action's parameters (VALUE read as YAML)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--param {pair!r}: want KEY=VALUE")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    check_json_target(args)
    if args.verb == "bundle":
        return write_bundle(args)
    if args.verb == "act":
        body = {
            "incident": args.id,
            "action": args.action,
            "params": params_of(args.param),
            "why": args.why,
        }
        doc = ask(args, lambda c: c.call("POST", "/v1/actions", REFUSED, body))
    else:
        path = f"/v1/incidents/{args.id}/{VERBS[args.verb][0]}"
        doc = ask(args, lambda c: c.call("POST", path, REFUSED))
    if doc is None:
        return ExitCode.UNAVAILABLE
    emit_json(args, doc)
    if not json_to_stdout(args):
        told = ", ".join(f"{k} {v}" for k, v in doc.items() if k not in ("incident", "queued_at"))
        print(f"incident {args.id} {args.verb}: {told}")
    return ExitCode.OK


def write_bundle(args: argparse.Namespace) -> int:
    if args.output is not None and not args.output.resolve().parent.is_dir():
        raise InputError(f"-o {args.output}: {args.output.parent} is not a directory")

    def fetch(client: Client) -> dict[str, Any]:
        summary = client.call("GET", f"/v1/incidents/{args.id}", REFUSED).get("bundle")
        if summary is None:
            raise InputError(f"incident {args.id} has no evidence bundle (yet)")
        data = client.download(f"/v1/incidents/{args.id}/bundle", REFUSED)
        return {"summary": summary, "data": data}

    got = ask(args, fetch)
    if got is None:
        return ExitCode.UNAVAILABLE
    summary, data = got["summary"], got["data"]
    sha = hashlib.sha256(data).hexdigest()
    if sha != summary["sha256"]:
        raise InputError(f"the bundle's bytes hash to {sha}, not {summary['sha256']} as sealed")
    path = args.output or Path(f"incident-{args.id}-{sha[:12]}.tar.gz")
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() != sha:
        raise InputError(f"{path} exists and holds other bytes: not overwritten")
    try:
        path.write_bytes(data)
    except OSError as e:
        raise InputError(f"{path}: cannot write it: {e.strerror or e}") from None
    doc = {"incident": args.id, "path": str(path), **summary}
    emit_json(args, doc)
    if not json_to_stdout(args):
        missing = "; ".join(f"{k}: {v}" for k, v in summary["missing"].items()) or "nothing"
        print(
            f"incident {args.id}: bundle {sha} ({len(data)} bytes) written to {path}\n"
            f"  ranks' part captured in {summary['capture_s']} s, sealed in "
            f"{summary['seal_s']} s; missing: {missing}"
        )
    return ExitCode.OK
