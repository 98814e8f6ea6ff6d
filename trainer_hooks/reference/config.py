"""Command-line flags of the reference trainer, validated once into a frozen TrainConfig."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainer_hooks.reference.data import CorpusSpec, parse_skip_list
from trainer_hooks.reference.model import ModelArgs


class ConfigError(ValueError):
    """Bad flags: the message says which and why; the entry point exits 2."""


class NothingToHeal(RuntimeError):
    """A replica launched to heal found no replica in its quorum that holds the model: every
    one was lost or is itself still joining. Training from its own state would retrain steps
    from a reset model under an exact-looking ledger; the job needs a restart from a
    checkpoint instead. Raised on every rank of the replica together (they share a quorum)."""


# The replica mode's torchft timeouts (seconds), each overridden by torchft's own variable.
# `timeout`: a cross-replica collective, the commit vote and a state transfer; a replica whose
# device stopped answering (alive, still heartbeating) is seen only when it runs out.
# `quorum`: how long a step waits for the lighthouse's quorum (a spare's first quorum included).
# `connect`: reaching the lighthouse and the replicas' managers.
FT_TIMEOUT_S = 30.0
FT_QUORUM_TIMEOUT_S = 120.0
FT_CONNECT_TIMEOUT_S = 10.0
FT_TIMEOUT_ENV = {
    "timeout": "TORCHFT_TIMEOUT_SEC",
    "quorum_timeout": "TORCHFT_QUORUM_TIMEOUT_SEC",
    "connect_timeout": "TORCHFT_CONNECT_TIMEOUT_SEC",
}
REPLICA_ENV = "SENTINEL_REPLICA"  # this process's replica index, 0 .. dp-1
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # the lighthouse's address, http://HOST:PORT


@dataclass(frozen=True)
class ReplicaSettings:
    """`--replicas ft`: this process's replica, the lighthouse, torchft's timeouts."""

    replica: int
    lighthouse: str
    timeout_s: float = FT_TIMEOUT_S
    quorum_timeout_s: float = FT_QUORUM_TIMEOUT_S
    connect_timeout_s: float = FT_CONNECT_TIMEOUT_S
    # This launch replaces a lost replica while its peers train on: it holds nothing of the
    # job's state until it heals from one of them, and must never train from its own.
    heal: bool = False


@dataclass(frozen=True)
class TrainConfig:
    model: ModelArgs
    corpus: CorpusSpec
    tp: int
    pp: int
    dp: int
    mbs: int
    accum: int
    steps: int
    lr: float
    min_lr: float
    warmup: int
    weight_decay: float
    clip: float
    seed: int
    schedule: str
    dp_mode: str
    dtype: str
    out: Path
    data_dir: Path
    ckpt_dir: Path
    durable_dir: Path | None
    checkpoint_every: int
    keep: int
    checkpoint_mode: str
    resume_from: str | None
    skip_batches: frozenset[int]
    lr_scale: tuple[float, int] | None
    lr_scale_from: int | None  # the window's first step; None: the step the run starts at
    fault_file: Path | None
    fault_flags: tuple[str, ...] = field(default_factory=tuple)
    digest_out: Path | None = None
    quiet: bool = False
    cpu_threads: int = 1
    hooks_interleave: int = 0  # steps per hooks-on / hooks-off block; 0: hooks on throughout
    hooks_interleave_seed: int = 0
    ft: ReplicaSettings | None = None  # None: one gang; set: this gang is one of dp replicas

    @property
    def global_batch(self) -> int:
        return self.mbs * self.accum * self.dp

    @property
    def microbatches(self) -> int:
        """Micro-batches per global batch (each `mbs` rows), however many replicas are live."""
        return self.accum * self.dp


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer_hooks.reference.train",
        description="Reference TP x PP x DP trainer. Run one process per rank with RANK, "
        "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set (torchrun does).",
    )
    a = p.add_argument
    a("--tp", type=int, default=1, help="tensor-parallel width")
    a("--pp", type=int, default=1, help="pipeline stages")
    a("--dp", type=int, default=None, help="data-parallel width (default: world / (tp*pp))")
    _add_replica_options(a)
    a("--layers", type=int, default=4)
    a("--dim", type=int, default=64)
    a("--heads", type=int, default=4)
    a("--vocab", type=int, default=256)
    a("--seq", type=int, default=32)
    a("--mbs", type=int, default=2, help="rows per micro-batch")
    a("--accum", type=int, default=2, help="micro-batches per step (pipeline micro-batches)")
    a("--steps", type=int, default=20, help="train until this many steps are done")
    a("--lr", type=float, default=1e-2)
    a("--min-lr", type=float, default=1e-3)
    a("--warmup", type=int, default=5)
    a("--weight-decay", type=float, default=0.1)
    a("--clip", type=float, default=1.0, help="max global grad norm (0: no clipping)")
    a("--seed", type=int, default=7, help="model init and batch sampling seed")
    a("--corpus-seed", type=int, default=1234)
    a("--corpus-tokens", type=int, default=1 << 18)
    a("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    a(
        "--dp-mode",
        choices=["allreduce", "fsdp"],
        default="allreduce",
        help="allreduce: replicated params, gradient all-reduce; fsdp: FSDP2 fully_shard",
    )
    a(
        "--dtype",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="auto: bf16 autocast on a GPU that supports it, fp32 otherwise",
    )
    a(
        "--cpu-threads",
        type=int,
        default=1,
        help="intra-op threads on CPU; part of the numerics: a resume must use the same value",
    )
    a("--out", type=Path, required=True, help="run dir: metrics.jsonl, ckpt/, faults/")
    a("--data-dir", type=Path, default=None, help="corpus dir (default OUT/data)")
    a(
        "--ckpt-dir",
        type=Path,
        default=None,
        help="fast checkpoint tier (default OUT/ckpt); node-local disks are detected, and "
        "'{node}' in the path names this rank's node",
    )
    a("--durable-dir", type=Path, default=None, help="durable tier, copied in the background")
    a("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: none)")
    a("--keep", type=int, default=3, help="committed checkpoints kept per tier")
    a(
        "--checkpoint-mode",
        choices=["async", "sync", "alternate"],
        default="async",
        help="async: dcp.async_save; sync: blocking dcp.save; alternate: both (benchmarks)",
    )
    a("--resume-from", default=None, help="checkpoint dir, or 'latest' (either tier)")
    a("--skip-batches", default="", help="global batch indices never trained on: 70-79,95")
    a(
        "--lr-scale",
        default=None,
        help="FACTOR:STEPS[@FROM], scale the LR for STEPS steps from step FROM (default: the "
        "step the run starts at; a clean reference run names the step a restart resumed from)",
    )
    a("--faults", type=Path, default=None, help="scenario YAML whose faults to inject")
    a("--fault", action="append", default=[], help="one fault, e.g. sdc:rank=1,at_step=3")
    a("--digest-out", type=Path, default=None, help="write the final parameter digest here")
    a("--quiet", action="store_true", help="metrics to the file only, not stdout")
    a(
        "--hooks-interleave",
        type=int,
        default=0,
        metavar="BLOCK",
        help="overhead measurement: alternate blocks of BLOCK steps with every Sentinel hook on "
        "and with the hooks bypassed (no hook call at all), pairs of blocks in a seeded random "
        "order, the same on every rank; each rank writes its per-step wall and CPU time and arm "
        "to OUT/hooks-interleave-<rank>.json (0: off, hooks on in every step)",
    )
    a(
        "--hooks-interleave-seed",
        type=int,
        default=0,
        help="seed of the --hooks-interleave block order",
    )
    return p


def _add_replica_options(a: Callable[..., object]) -> None:
    """How data-parallel replicas are joined, and torchft's timeouts when they are."""
    a(
        "--replicas",
        choices=["gang", "ft"],
        default="gang",
        help="gang: one world of tp*pp*dp ranks; ft: each data-parallel replica is its own "
        f"tp*pp world joined to the others by torchft (needs --dp, {REPLICA_ENV} and "
        f"{LIGHTHOUSE_ENV}); a lost replica leaves, the others keep stepping",
    )
    a(
        "--ft-timeout",
        type=float,
        default=None,
        help=f"seconds: cross-replica collective, commit vote, state transfer (default "
        f"{FT_TIMEOUT_S:g}, or {FT_TIMEOUT_ENV['timeout']})",
    )
    a(
        "--ft-quorum-timeout",
        type=float,
        default=None,
        help=f"seconds a step waits for its quorum (default {FT_QUORUM_TIMEOUT_S:g}, or "
        f"{FT_TIMEOUT_ENV['quorum_timeout']})",
    )
    a(
        "--ft-connect-timeout",
        type=float,
        default=None,
        help=f"seconds to reach the lighthouse and managers (default {FT_CONNECT_TIMEOUT_S:g}, "
        f"or {FT_TIMEOUT_ENV['connect_timeout']})",
    )
    a(
        "--ft-heal",
        action="store_true",
        help="this replica replaces a lost one while its peers train on: it heals from a live "
        "peer at its first quorum, and exits (code 1) if no replica there holds the model",
    )


def _lr_scale(text: str | None) -> tuple[tuple[float, int] | None, int | None]:
    if text is None:
        return None, None
    window, at, start = text.partition("@")
    f, sep, n = window.partition(":")
    try:
        factor, steps = float(f), int(n)
        first = int(start) if at else None
    except ValueError:
        raise ConfigError(
            f"--lr-scale {text!r}: want FACTOR:STEPS[@FROM], e.g. 0.5:20 or 0.5:20@40"
        ) from None
    if not sep or factor <= 0 or steps < 1 or (first is not None and first < 0):
        raise ConfigError(f"--lr-scale {text!r}: want FACTOR > 0, STEPS >= 1 and FROM >= 0")
    return (factor, steps), first


def _timeout(flag: float | None, key: str, default: float, env: Mapping[str, str]) -> float:
    name = FT_TIMEOUT_ENV[key]
    text = env.get(name)
    try:
        # torchft's own variable wins inside its Manager, so it wins here too
        value = float(text) if text else (default if flag is None else flag)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: want seconds") from None
    if value <= 0:
        raise ConfigError(f"--ft-{key.replace('_', '-')} / {name}: want seconds > 0, got {value}")
    return value


def _replica_settings(ns: argparse.Namespace, dp: int, env: Mapping[str, str]) -> ReplicaSettings:
    text, lighthouse = env.get(REPLICA_ENV, ""), env.get(LIGHTHOUSE_ENV, "")
    if not text.isdigit() or int(text) >= dp:
        raise ConfigError(f"--replicas ft: {REPLICA_ENV}={text!r}, want 0 .. {dp - 1} (--dp {dp})")
    if not lighthouse:
        raise ConfigError(f"--replicas ft: {LIGHTHOUSE_ENV} is not set (http://HOST:PORT)")
    if ns.dp_mode != "allreduce":
        raise ConfigError(
            "--replicas ft: replicas reduce gradients across; --dp-mode must be allreduce"
        )
    if ns.hooks_interleave:
        raise ConfigError("--hooks-interleave measures one gang; not with --replicas ft")
    if ns.ft_heal and ns.resume_from:
        raise ConfigError("--ft-heal takes its state from a live peer; not with --resume-from")
    return ReplicaSettings(
        replica=int(text),
        lighthouse=lighthouse,
        timeout_s=_timeout(ns.ft_timeout, "timeout", FT_TIMEOUT_S, env),
        quorum_timeout_s=_timeout(ns.ft_quorum_timeout, "quorum_timeout", FT_QUORUM_TIMEOUT_S, env),
        connect_timeout_s=_timeout(
            ns.ft_connect_timeout, "connect_timeout", FT_CONNECT_TIMEOUT_S, env
        ),
        heal=ns.ft_heal,
    )


def model_of(argv: list[str]) -> tuple[ModelArgs, int]:
    """The model's shape and seed from the trainer's arguments, as `parse_config` reads them,
    with nothing else checked (a process can build the model before it knows its rank)."""
    ns = build_parser().parse_args(argv)
    args = ModelArgs(vocab=ns.vocab, dim=ns.dim, layers=ns.layers, heads=ns.heads, seq=ns.seq)
    return args, ns.seed


def parse_config(
    argv: list[str] | None, world: int, env: Mapping[str, str] | None = None
) -> TrainConfig:
    """`env` (the process environment by default) names the replica and the lighthouse."""
    ns = build_parser().parse_args(argv)
    env = {} if env is None else env
    ft = ns.replicas == "ft"
    if ft and ns.dp is None:
        raise ConfigError("--replicas ft: give --dp, the number of replicas")
    if ns.ft_heal and not ft:
        raise ConfigError("--ft-heal: only a replica heals from a peer (--replicas ft)")
    gang = ns.tp * ns.pp if ft else None  # one replica's world
    dp = ns.dp if ns.dp is not None else world // max(1, ns.tp * ns.pp)
    if gang is not None and (min(ns.tp, ns.pp, dp) < 1 or gang != world):
        raise ConfigError(f"--replicas ft: tp*pp = {ns.tp}*{ns.pp} must equal WORLD_SIZE={world}")
    if gang is None and (min(ns.tp, ns.pp, dp) < 1 or ns.tp * ns.pp * dp != world):
        raise ConfigError(f"tp*pp*dp = {ns.tp}*{ns.pp}*{dp} must equal WORLD_SIZE={world}")
    if ns.heads % ns.tp or ns.dim % ns.heads:
        raise ConfigError(f"--heads {ns.heads} must divide --dim {ns.dim} and be divisible by --tp")
    if ns.layers < ns.pp:
        raise ConfigError(f"--layers {ns.layers} < --pp {ns.pp}: every stage needs a layer")
    if ns.cpu_threads < 1:
        raise ConfigError(f"--cpu-threads {ns.cpu_threads}: want at least 1")
    if ns.pp > 1 and ns.accum < ns.pp:
        raise ConfigError(
            f"--accum {ns.accum} < --pp {ns.pp}: the pipeline needs >= pp micro-batches"
        )
    if min(ns.mbs, ns.accum, ns.steps, ns.keep, ns.seq) < 1 or ns.checkpoint_every < 0:
        raise ConfigError(
            "--mbs, --accum, --steps, --keep, --seq must be >= 1; --checkpoint-every >= 0"
        )
    if ns.hooks_interleave < 0:
        raise ConfigError(f"--hooks-interleave {ns.hooks_interleave}: want BLOCK >= 1, or 0 (off)")
    if ns.corpus_tokens < 4 * (ns.seq + 1):
        raise ConfigError(f"--corpus-tokens {ns.corpus_tokens} is too small for --seq {ns.seq}")
    try:
        skip = parse_skip_list(ns.skip_batches)
    except ValueError as e:
        raise ConfigError(f"--skip-batches: {e}") from None
    lr_scale, lr_scale_from = _lr_scale(ns.lr_scale)
    out: Path = ns.out
    settings = _replica_settings(ns, dp, env) if ft else None
    ckpt_dir: Path = ns.ckpt_dir or out / "ckpt"
    durable_dir: Path | None = ns.durable_dir
    if settings is not None:  # each replica saves its own copy; a lost one heals from a peer
        ckpt_dir = ckpt_dir / f"replica-{settings.replica}"
        durable_dir = durable_dir / f"replica-{settings.replica}" if durable_dir else None
    return TrainConfig(
        model=ModelArgs(vocab=ns.vocab, dim=ns.dim, layers=ns.layers, heads=ns.heads, seq=ns.seq),
        corpus=CorpusSpec(vocab=ns.vocab, tokens=ns.corpus_tokens, seed=ns.corpus_seed),
        tp=ns.tp,
        pp=ns.pp,
        dp=dp,
        mbs=ns.mbs,
        accum=ns.accum,
        steps=ns.steps,
        lr=ns.lr,
        min_lr=ns.min_lr,
        warmup=ns.warmup,
        weight_decay=ns.weight_decay,
        clip=ns.clip,
        seed=ns.seed,
        schedule=ns.schedule,
        dp_mode=ns.dp_mode,
        dtype=ns.dtype,
        out=out,
        data_dir=ns.data_dir or out / "data",
        ckpt_dir=ckpt_dir,
        durable_dir=durable_dir,
        checkpoint_every=ns.checkpoint_every,
        keep=ns.keep,
        checkpoint_mode=ns.checkpoint_mode,
        resume_from=ns.resume_from,
        skip_batches=skip,
        lr_scale=lr_scale,
        lr_scale_from=lr_scale_from,
        fault_file=ns.faults,
        fault_flags=tuple(ns.fault),
        digest_out=ns.digest_out,
        quiet=ns.quiet,
        cpu_threads=ns.cpu_threads,
        hooks_interleave=ns.hooks_interleave,
        hooks_interleave_seed=ns.hooks_interleave_seed,
        ft=settings,
    )
