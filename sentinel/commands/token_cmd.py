"""`sentinel token create|revoke|list`: coordinator access tokens, in the state dir's store."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sentinel.exitcodes import ExitCode, InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="create, revoke or list coordinator access tokens")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    for name, fn, text in (
        ("create", run_create, "create a token (printed once)"),
        ("revoke", run_revoke, "revoke a token by id"),
        ("list", run_list, "list tokens (ids and scopes, never secrets)"),
    ):
        t = tsub.add_parser(name, help=text)
        t.add_argument("--config", type=Path)
        t.add_argument("--state-dir", type=Path)
        t.add_argument("--json", action="store_true")
        if name == "create":
            t.add_argument("--role", required=True, choices=["node", "job", "operator", "admin"])
            t.add_argument("--node")
            t.add_argument("--job")
        if name == "revoke":
            t.add_argument("id")
        t.set_defaults(handler=fn)


def _tokens(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from sentinel.commands.coordinator_cmd import coordinator_config
    from sentinel.coordinator.auth import TokenStore
    from sentinel.coordinator.service import STORE_FILE
    from sentinel.coordinator.store import Store

    cfg = coordinator_config(args)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    return TokenStore(Store(cfg.state_dir / STORE_FILE))


def run_create(args: argparse.Namespace) -> int:
    from sentinel.coordinator.auth import Role

    tokens = _tokens(args)
    try:
        token_id, secret = tokens.create(Role(args.role), args.node, args.job, now=time.time())
    except ValueError as e:
        raise InputError(str(e)) from None
    if args.json:
        print(
            json.dumps(
                {
                    "id": token_id,
                    "token": secret,
                    "role": args.role,
                    "node": args.node,
                    "job": args.job,
                }
            )
        )
    else:
        print(f"id {token_id} ({args.role}); the token, shown once:\n{secret}")
    return ExitCode.OK


def run_revoke(args: argparse.Namespace) -> int:
    if not _tokens(args).revoke(args.id, now=time.time()):
        raise InputError(f"no active token with id {args.id!r}")
    print(f"revoked {args.id}")
    return ExitCode.OK


def run_list(args: argparse.Namespace) -> int:
    rows = [
        {
            "id": t.id,
            "role": t.role,
            "node": t.node,
            "job": t.job,
            "created_at": t.created_at,
            "revoked_at": t.revoked_at,
        }
        for t in _tokens(args).store.tokens()
    ]
    if args.json:
        print(json.dumps(rows))
    for r in [] if args.json else rows:
        state = "revoked" if r["revoked_at"] else "active"
        print(f"{r['id']}  {r['role']:<8} {r['node'] or r['job'] or '-':<16} {state}")
    return ExitCode.OK
