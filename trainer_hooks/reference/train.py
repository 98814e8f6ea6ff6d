"""Entry point: `python -m trainer_hooks.reference.train --out DIR [flags]`, one process per rank.

The step boundary is marked below: a hook added there sees `result.loss` and
`result.grad_norm` as tensors (no host sync needed) and the global loss as a float.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch
import torch.distributed as dist

from sentinel.exitcodes import InputError
from sentinel.ranks.current import leave_requested
from trainer_hooks import SentinelHooks, enable_flight_recorder, interleave
from trainer_hooks.reference.checkpoint import TierError, expand_node, resolve_resume, this_node
from trainer_hooks.reference.config import ConfigError, NothingToHeal, TrainConfig, parse_config
from trainer_hooks.reference.digest import param_digest
from trainer_hooks.reference.engine import StepResult
from trainer_hooks.reference.faults import load_faults
from trainer_hooks.reference.instrument import build_hooks
from trainer_hooks.reference.job import (
    Job,
    PreparedModel,
    build_job,
    device_and_backend,
    prepare_model,
)

_checkpoint_requested = False


def _request_checkpoint(_sig: int, _frame: object) -> None:
    global _checkpoint_requested
    _checkpoint_requested = True


def _emit(line: dict[str, Any], files: list[TextIO]) -> None:
    text = json.dumps(line)
    for f in files:
        print(text, file=f, flush=True)


@dataclass
class Trained:
    """A committed step: what it trained on and how (`ft`: the replica mode's extras)."""

    batch: int
    lr: float
    result: StepResult
    tokens: int  # this rank's gang's trained tokens in the step
    ft: dict[str, Any] = field(default_factory=dict)


def train_gang(job: Job, step: int) -> Trained:
    """One gang: this dp rank's share of the step's global batch."""
    cfg = job.cfg
    job.injector.before_step(step)
    batch = job.loader.peek()
    toks = job.loader.microbatches(batch, job.loader.share())
    toks = job.injector.corrupt_batch(batch, toks).to(job.device)
    lr = job.lr.apply(job.opt, step)
    result = job.step_fn(toks, cfg.accum, cfg.accum)
    shares = {r: range(r * cfg.accum, (r + 1) * cfg.accum) for r in range(cfg.dp)}
    job.committed(batch, None, shares)
    return Trained(batch, lr, result, cfg.accum * cfg.mbs * cfg.model.seq)


def train_replica(job: Job, out: list[TextIO]) -> Trained | None:
    """A replica (--replicas ft): the quorum's share of the global batch, until a commit.
    None when the replica was asked to leave its generation before the step committed."""
    cfg, link = job.cfg, job.link
    assert link is not None
    attempts = 0
    while True:
        attempts += 1
        if not link.start(leave_requested):  # a replica behind its peers heals here
            return None
        job.supersede_later_checkpoints()
        if link.healed is not None:
            _emit(job.tag({"heal": link.healed | {"step": job.step}}), out)
        batch = job.loader.peek()
        plan = link.assign(batch)
        job.injector.before_step(job.step)  # after the quorum: a stuck rank stalls its peers
        toks = job.loader.microbatches(batch, plan.mine)
        toks = job.injector.corrupt_batch(batch, toks).to(job.device)
        lr = job.lr.apply(job.opt, job.step)
        result = job.step_fn(toks, len(plan.mine), cfg.microbatches)
        if result.committed:
            break
        line = {"step": job.step, "quorum": plan.quorum, "error": link.error(), "t": time.time()}
        _emit(job.tag({"uncommitted": line}), out)
        if leave_requested():  # told to leave at once: the links this step needed are cut
            return None
    job.committed(batch, plan.quorum, link.assignment)
    ft: dict[str, Any] = {
        "quorum": plan.quorum,
        "quorum_rank": plan.rank,  # 0: the one replica whose line stands for the step
        "participants": plan.participants,
        "microbatches": len(plan.mine),
    }
    ft |= {"attempts": attempts, "t": time.time()}
    return Trained(batch, lr, result, len(plan.mine) * cfg.mbs * cfg.model.seq, job.tag(ft))


def run_step(job: Job, out: list[TextIO], hooks: SentinelHooks | None, step: int) -> bool:
    """One step; `hooks=None` runs it without a single hook call (the bare trainer's step).
    True when the gang agreed to leave this generation after it (a warm restart)."""
    global _checkpoint_requested
    cfg = job.cfg
    t0 = time.perf_counter()
    if hooks:
        hooks.begin_step(step, tokens=cfg.mbs * cfg.accum * cfg.model.seq)
    done = train_replica(job, out) if job.link else train_gang(job, step)
    if done is None:
        return True
    result = done.result
    if hooks:
        loss = result.loss if job.step_fn.last else None
        # the step it trained: a replica that healed in it jumped to its peers' (job.step moved
        # on past it at the commit)
        hooks.observe(loss=loss, grad_norm=result.grad_norm, tokens=done.tokens, step=job.step - 1)
    # The global loss: a gang's dp ranks each hold their share's mean; a replica holds the
    # whole batch's (its peers' summed in).
    share = 1.0 if job.link else 1 / cfg.dp
    mine = result.loss * share if job.reports_loss and result.loss is not None else 0.0
    asked = _checkpoint_requested or (hooks is not None and hooks.checkpoint_asked())
    flags = [float(mine), float(asked), float(leave_requested())]
    stats = torch.tensor(flags, dtype=torch.float64, device=job.device)
    # The global loss on every rank, "a rank got SIGUSR1 or a `checkpoint.now`", and "a rank
    # was asked to leave": every rank learns the last two in the same step, so all of them act
    # on it together (a coordinator's save a step after the first rank heard of it).
    dist.all_reduce(stats)
    step_s = time.perf_counter() - t0
    job.injector.after_step()
    if hooks:
        hooks.end_step()
    # ---- step boundary: result.loss, result.grad_norm (tensors), stats[0] (global loss) ----
    line = {"step": job.step, "loss": stats[0].item(), "lr": done.lr, "batch": done.batch}
    line |= {"grad_norm": result.grad_norm.item(), "tokens": job.tokens, "step_s": step_s}
    stall = job.ckpt.take_stall()  # this step's wait for the last save's staging copy
    line |= done.ft | ({} if stall is None else {"ckpt_stall_s": stall})
    _emit(line, out)
    job.ckpt.poll()
    # a coordinator `checkpoint.now` the hooks' exchange agreed on, the same step everywhere
    # (hook-less steps cannot see it)
    on_command = hooks.should_checkpoint() if hooks else False
    if (
        (cfg.checkpoint_every and job.step % cfg.checkpoint_every == 0)
        or stats[1].item() > 0
        or on_command
    ):
        _checkpoint_requested = False
        if hooks:
            hooks.saving()
        _emit(job.tag(job.save(job.step)), out)
    return stats[2].item() > 0


def train_loop(job: Job, out: list[TextIO], hooks: SentinelHooks) -> bool:
    """Train to the last step; True when the gang left the generation before it."""
    if job.cfg.hooks_interleave:
        interleaved_loop(job, out, hooks)
        return False
    while job.step < job.cfg.steps:  # a healing replica jumps to its peers' step
        if run_step(job, out, hooks, job.step):
            _emit(job.tag({"left": job.step}), out)
            return True
    return False


def interleaved_loop(job: Job, out: list[TextIO], hooks: SentinelHooks) -> None:
    """`--hooks-interleave BLOCK`: blocks of steps with every hook on and with none, one run.

    Each step is timed whole (wall and this process's CPU, every thread), from before
    `begin_step` to after the checkpoint decision, so an on-step carries all of the hooks'
    main-thread work. The hooks' periodic work (gang exchange every `exchange_every` steps, SDC
    check every `sdc_every`) follows their own step count, which advances only in on-steps:
    the on-arm therefore carries exactly one exchange per `exchange_every` hooked steps and one
    SDC check per `sdc_every`, the rate of a run with hooks on throughout, however the blocks
    fall. (Counting off-steps too would fire the periodic work only when its step happened to
    land in an on-block: the same rate on average, but lumpy and seed-dependent.) The step
    reports (`report_every`) key on the trainer's step number; each step is on or off with
    equal chance whatever its number, so the on-arm gets its share of them on average.
    Each on-step records the periodic work the hooks did in it (`hooks.periodic_work`): an
    exchange is posted at one hooked step and acted on at the next, and an SDC check computes
    its digests ("sdc") at the step after the exchange that called it and judges them at the
    next ("exchange", as is every step that only posts or takes a gather).
    Off-steps run inside `hooks.bypassed()`, entered and left between steps, outside the timed
    window, as is a barrier before every step (see below). Process-wide state stays as set up
    for the run in both arms: PyTorch's flight recorder buffer (TORCH_FR_BUFFER_SIZE), the
    hooks' transport and watchdog threads (idle unless woken) and the side process group.
    """
    cfg = job.cfg
    arms = interleave.schedule(cfg.steps, cfg.hooks_interleave, cfg.hooks_interleave_seed)
    interleave.check_agreement(arms)  # a rank that disagreed would deadlock the side group
    hcfg = hooks.config
    record: dict[str, Any] = {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "block": cfg.hooks_interleave,
        "seed": cfg.hooks_interleave_seed,
        "fingerprint": interleave.fingerprint(arms),
        "hooks_enabled": hcfg.enabled,
        "exchange_every": hcfg.exchange_every,
        "sdc_every": hcfg.sdc_every,
        "steps": [],
        "on": [],
        "wall_s": [],
        "cpu_s": [],
        "periodic": [],  # on-steps: "sdc" (an SDC check's digests computed), "exchange", None
    }
    bypassed = False
    with contextlib.ExitStack() as bypass:
        for step in range(job.start, cfg.steps):
            on = arms[step]
            if on == bypassed:  # the arm changes here, between two steps
                if on:
                    bypass.close()
                else:
                    bypass.enter_context(hooks.bypassed())
                bypassed = not on
            # Untimed and in both arms: without it, work after the step's last collective
            # (the hooks' end_step: exchange, SDC check) on a slower rank would be waited for
            # inside the next step's collectives, charging it to the next step's arm. With it,
            # the gang's time for a step is the slowest rank's wall time.
            dist.barrier()
            wall0, cpu0 = time.perf_counter(), time.process_time()
            run_step(job, out, hooks if on else None, step)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            periodic = hooks.periodic_work if on else None
            for key, value in zip(
                ("steps", "on", "wall_s", "cpu_s", "periodic"),
                (step, on, wall, cpu, periodic),
                strict=True,
            ):
                record[key].append(value)
    record["hook_errors"] = hooks.errors
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / f"hooks-interleave-{dist.get_rank()}.json").write_text(json.dumps(record))


def train(cfg: TrainConfig, resume: Any, faults: list[Any], started: dict[str, float]) -> None:
    job = build_job(cfg, resume, faults)
    # Everything the generation opened is closed when it ends, whichever way: a warm rank
    # process runs the next generation in this same process.
    with contextlib.ExitStack() as generation:
        generation.callback(job.close)  # last: a replica leaves its peers
        generation.callback(job.ckpt.close)
        out: list[TextIO] = []
        if dist.get_rank() == 0:
            cfg.out.mkdir(parents=True, exist_ok=True)
            metrics = generation.enter_context((cfg.out / "metrics.jsonl").open("a"))
            out = [metrics] + ([] if cfg.quiet else [sys.stdout])
        hooks = build_hooks(job)
        generation.callback(hooks.close)
        # Reported at the commit (rank 0 writes COMMITTED once every rank's write has landed),
        # not when a save starts: only a committed checkpoint can be resumed from, so "steps
        # since the last checkpoint" counts the steps a restart now would really lose.
        job.ckpt.on_commit = lambda step, blocked_s, path: hooks.checkpoint_saved(
            step, blocked_s=blocked_s, path=str(path)
        )
        # Where this launch's start-up went (wall-clock epochs, so a supervisor or a drill on
        # the same clock can place them): the process was running its code from `main_at`, the
        # rendezvous took `rendezvous_s`, the checkpoint load `load_s`, and the first step
        # begins at `ready_at`.
        launch = {
            **started,
            "load_s": job.load_s,
            "ready_at": time.time(),
            "resume_step": job.start,
        }
        # which generation, and how many ranks this report speaks for (a replica's world)
        world = {"generation": int(os.environ.get("SENTINEL_GENERATION", "0"))}
        world["ranks"] = dist.get_world_size()
        _emit({"launch": job.tag(launch) | world}, out)
        if dist.get_rank() == 0:  # the coordinator times a repair's relaunch from it
            hooks.launched(**launch)
        left = train_loop(job, out, hooks)
        job.ckpt.finish()  # commits the last save while the hooks can still report it
        if left:
            return
        digest = param_digest(job.model, job.mesh)
        _emit(job.tag({"final_step": cfg.steps, "digest": digest, "tokens": job.tokens}), out)
        if out and cfg.digest_out:
            cfg.digest_out.write_text(digest + "\n")


def prepare(argv: list[str]) -> PreparedModel:
    """For a warm rank process waiting for its rank: the model built ahead (`job.full_model`)."""
    return prepare_model(argv)


def main(argv: list[str] | None = None) -> int:
    """One generation of one rank; a warm rank process calls it once per generation."""
    global _checkpoint_requested
    _checkpoint_requested = False
    main_at = time.time()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg = parse_config(argv, world, os.environ)
        faults = load_faults(cfg.fault_file, cfg.fault_flags)
        tiers = [expand_node(cfg.ckpt_dir, this_node())]
        tiers += [cfg.durable_dir] if cfg.durable_dir else []
        resume = resolve_resume(cfg.resume_from, tiers) if cfg.resume_from else None
    except (ConfigError, InputError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, default)
    os.environ.setdefault("MASTER_PORT", "29511")
    signal.signal(signal.SIGUSR1, _request_checkpoint)
    enable_flight_recorder()  # PyTorch's own recorder, before the process group exists
    if not torch.cuda.is_available():
        # On CPU the intra-op thread count changes reduction order: it is part of the numerical
        # program, so the trainer pins it itself, whoever launched it (torchrun, sentinel run).
        torch.set_num_threads(cfg.cpu_threads)
    rendezvous_at = time.time()
    dist.init_process_group(device_and_backend()[1])
    started = {"main_at": main_at, "rendezvous_s": time.time() - rendezvous_at}
    try:
        train(cfg, resume, faults, started)
    except (interleave.ScheduleMismatchError, TierError) as e:  # raised on every rank together
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NothingToHeal as e:  # on every rank of the replica together
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()
        if cfg.ft is not None:
            # torchft's Manager holds itself in reference cycles: free it (its servers' runtime
            # threads, its store client) now, not at some later collection
            gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
