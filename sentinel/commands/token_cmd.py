"""`sentinel token create|revoke|list`: coordinator access tokens, in the state dir's store."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sentinel.commands.jsonout import add_json_option, emit_json, json_to_stdout
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
        t.add_argument("--config", type=Path, help="coordinator config file (its state_dir)")
        t.add_argument(
            "--state-dir", type=Path, help="the coordinator's state directory (its token store)"
        )
        if name == "create":
            t.add_argument(
                "--role",
                required=True,
                choices=["node", "job", "operator", "admin"],
                help="node: one agent; job: one supervisor; operator: read and act; admin: all",
            )
            t.add_argument("--node", help="the node a node token speaks for (--role node)")
            t.add_argument("--job", help="the job a job token speaks for (--role job)")
        if name == "revoke":
            t.add_argument("id", help="the token id (`sentinel token list` shows them)")
        add_json_option(t, "the token" if name == "create" else "the result")
        t.set_defaults(handler=fn)


def _tokens(args: argparse.Namespace, create: bool = False):  # type: ignore[no-untyped-def]
    from sentinel.commands.coordinator_cmd import coordinator_config
    from sentinel.config import CoordinatorConfig
    from sentinel.coordinator.core.auth import TokenStore
    from sentinel.coordinator.store import STORE_FILE, SqliteStore

    cfg = coordinator_config(args)
    if cfg.store is not None:  # the replicas' shared PostgreSQL (config key `store`)
        from sentinel.coordinator.store import open_store

        return TokenStore(open_store(cfg)[0])
    path = cfg.state_dir / STORE_FILE
    # Named by --state-dir, a config file or SENTINEL_COORDINATOR__STATE_DIR.
    named = cfg.state_dir != CoordinatorConfig.model_fields["state_dir"].default
    # Only `create` makes a store, and only where it was told to: a default path under
    # /var/lib that does not exist means the wrong machine or a missing --state-dir.
    if not path.exists() and not (create and named):
        how = "is it the coordinator's state dir?" if named else "give --state-dir DIR or --config"
        raise InputError(f"no coordinator token store at {path}: {how}")
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    return TokenStore(SqliteStore(path))


def run_create(args: argparse.Namespace) -> int:
    from sentinel.coordinator.core.auth import Role

    tokens = _tokens(args, create=True)
    try:
        token_id, secret = tokens.create(Role(args.role), args.node, args.job, now=time.time())
    except ValueError as e:
        raise InputError(str(e)) from None
    doc = {"id": token_id, "token": secret, "role": args.role, "node": args.node, "job": args.job}
    emit_json(args, doc)
    if not json_to_stdout(args):
        print(f"id {token_id} ({args.role}); the token, shown once:\n{secret}")
    return ExitCode.OK


def run_revoke(args: argparse.Namespace) -> int:
    if not _tokens(args).revoke(args.id, now=time.time()):
        raise InputError(f"no active token with id {args.id!r}")
    emit_json(args, {"revoked": args.id})
    if not json_to_stdout(args):
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
    emit_json(args, rows)
    for r in [] if json_to_stdout(args) else rows:
        state = "revoked" if r["revoked_at"] else "active"
        print(f"{r['id']}  {r['role']:<8} {r['node'] or r['job'] or '-':<16} {state}")
    return ExitCode.OK
