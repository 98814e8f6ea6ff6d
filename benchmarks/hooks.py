"""hook_overhead_ratio: the reference trainer's time per step with every hook on / without.

Primary, in one run: the reference trainer (TP2 x PP2 x DP2, 8 gloo ranks, the demo
configuration; `--reference-layout TPxPPxDP` picks another, e.g. 2x1x1 for as many ranks as
a 2-core machine has cores) with `--hooks-interleave BLOCK` alternates blocks of BLOCK steps with every hook
on and with the hooks bypassed (no hook call at all), pairs of blocks in a seeded random order,
the same on every rank, so both arms see the same machine load. The hooks are set up as in a
supervised run: events to an agent socket (a sink process), flight recorder on with a dump
directory, step reports every 10 steps, the gang exchange every 20 hooked steps and a matmul +
parameter SDC check every 40 (far more often than a real run), counted on the hooks' own step
count, so the on-arm carries them at a real run's rate. The trainer puts an untimed barrier
before every step; a step's gang time is its slowest rank's wall time. After
`--reference-warmup` steps, `hook_overhead_ratio` = the 2%-trimmed mean of the gang step time
over on-steps / the same over off-steps, where the trimming drops the top and bottom 2% of
each arm's steps *without periodic work* and keeps every step with an exchange or SDC check,
so their cost is amortised in full, and keeps their twins in the off-arm too (the off-step at
the same place in the other block of the pair), so that preempted steps survive the trimming
at the same rate in both arms. Also reported: the plain means' ratio
(`interleaved_mean_ratio`), the medians' (`interleaved_median_ratio`, which hides the periodic
work), the gang CPU time's (all ranks, all threads; `interleaved_cpu_ratio`, trimmed the same
way), the mean cost of plain / exchange / SDC steps (steps where the hooks posted or took an
exchange or an SDC check's digests, and steps that computed those digests, as
`hooks.periodic_work` names them; `interleaved_periodic_steps` counts both kinds),
the gang CPU of plain on-steps, and `hook_overhead_ratio_ci95`, a 95%
bootstrap interval of the primary ratio resampling whole pairs of blocks (how much the
machine's noise leaves of the figure).

What an interleaved run cannot switch off per step: PyTorch's flight recorder buffer
(TORCH_FR_BUFFER_SIZE is process-wide, so it is on in both arms; `interleaved_fr_on_both_arms`),
and the hooks' idle threads and side process group. The secondary, whole-run measurement
includes them: pairs of whole runs, hooks on (as above) vs the bare trainer (hooks disabled,
no flight recorder), each pair in a random order, each rank timing a window of
`--whole-run-steps` after `--reference-warmup` untimed ones: `whole_run_wall_ratio` (median
over pairs of the on/off wall time per step) and `whole_run_cpu_ratio` (the gang's CPU time
per step). Between whole runs the machine's load drifts (other tenants), which is why they are
secondary. Skip all reference runs with `--no-reference`.

The toy loop: two gloo ranks train a small MLP with an explicit gradient all-reduce, steps
alternating (pairs of one-step blocks, each pair in a random order) between the instrumented
loop and the bare one. Reported for rank 0: `toy_hook_overhead_ratio` (median step times),
`toy_trimmed_mean_ratio` (counts the periodic work), `toy_cpu_time_ratio` (the process's CPU time per
step), and `hook_calls_ratio`, (bare step + mean time inside the hooks' calls) / bare step.
Target <= 1.01 on CPU. Last line of output: JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sentinel.processes import free_port
from trainer_hooks import HooksConfig, SentinelHooks
from trainer_hooks.interleave import schedule, twin


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tmp = tempfile.mkdtemp()
    hooks = SentinelHooks(
        HooksConfig(agent_socket=f"{tmp}/absent.sock", report_every=10, exchange_every=20),
        model=model,
    )
    x = torch.randn(64, 256)
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    inside: list[float] = []  # time spent inside the hooks' own calls, per instrumented step
    for step, on in enumerate(schedule(args.steps, args.block)):
        t0, c0 = time.perf_counter(), time.process_time()
        spent = 0.0
        if on:
            spent -= time.perf_counter()
            hooks.begin_step(step, tokens=64)
            spent += time.perf_counter()
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)
        grad_norm = flat.norm()
        if on:
            spent -= time.perf_counter()
            hooks.observe(loss=loss.detach(), grad_norm=grad_norm)
            spent += time.perf_counter()
        opt.step()
        opt.zero_grad()
        if on:
            spent -= time.perf_counter()
            hooks.end_step()
            spent += time.perf_counter()
        if step >= args.warmup:
            times[on].append(time.perf_counter() - t0)
            cpu[on].append(time.process_time() - c0)
            if on:
                inside.append(spent)
    hooks.close()
    if rank == 0:
        result = {
            "on": times[True],
            "off": times[False],
            "cpu_on": cpu[True],
            "cpu_off": cpu[False],
            "inside": inside,
            "errors": hooks.errors,
        }
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _trimmed_mean(values: list[float], cut: float = 0.02) -> float:
    """Mean without the top and bottom 2%: keeps the hooks' periodic work, drops the preempted."""
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    return statistics.fmean(ordered[k : len(ordered) - k])


# --- the reference trainer: whole runs, hooks on vs off ----------------------------------------

REFERENCE = ["--mbs", "2", "--accum", "2", "--quiet"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """The reference trainer's parallel layout; its ranks are one gloo process each."""

    tp: int = 2
    pp: int = 2
    dp: int = 2

    @classmethod
    def parse(cls, text: str) -> Layout:
        tp, pp, dp = (int(n) for n in text.lower().split("x"))
        if min(tp, pp, dp) < 1:
            raise ValueError(text)
        return cls(tp, pp, dp)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def argv(self) -> list[str]:
        return [*REFERENCE, "--tp", str(self.tp), "--pp", str(self.pp), "--dp", str(self.dp)]

    def __str__(self) -> str:
        return f"TP{self.tp} x PP{self.pp} x DP{self.dp}"


EXCHANGE_EVERY = 20  # the hooks' default: straggler scores and requests every 20 steps
SDC_EVERY = 40  # a matmul + parameter SDC check every 40 steps: far more often than a real run

# The agent's side of the socket: accept every rank, read and count event batches (lines).
SINK = """
import selectors, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(64)
sel = selectors.DefaultSelector()
sel.register(srv, selectors.EVENT_READ); sel.register(sys.stdin, selectors.EVENT_READ)
lines = 0
while True:
    for key, _ in sel.select():
        if key.fileobj is srv:
            sel.register(srv.accept()[0], selectors.EVENT_READ)
        elif key.fileobj is sys.stdin:
            if not sys.stdin.readline():
                print(lines, flush=True); sys.exit(0)
        else:
            data = key.fileobj.recv(65536)
            if not data:
                sel.unregister(key.fileobj); key.fileobj.close()
            lines += data.count(b"\\n")
"""


def timed_rank(argv: list[str]) -> int:
    """A reference-trainer rank that measures its own timed window: the real `train_loop` runs
    the warm-up steps, then the timed steps; the window's wall time and this process's CPU time
    (every thread: the trainer's, gloo's and the hooks') go to OUT/window-<rank>.json."""
    from trainer_hooks.reference import train

    warmup = int(os.environ["SENTINEL_BENCH_WARMUP"])
    real_loop = train.train_loop

    def loop(job: Any, out: Any, hooks: SentinelHooks) -> None:
        cfg = job.cfg
        job.cfg = dataclasses.replace(cfg, steps=warmup)
        real_loop(job, out, hooks)
        job.cfg, job.start = cfg, warmup
        wall0, cpu0 = time.perf_counter(), time.process_time()
        real_loop(job, out, hooks)
        window = {
            "wall_s": time.perf_counter() - wall0,
            "cpu_s": time.process_time() - cpu0,
            "steps": cfg.steps - warmup,
            "hook_errors": hooks.errors,
        }
        (cfg.out / f"window-{dist.get_rank()}.json").write_text(json.dumps(window))

    train.train_loop = loop
    return train.main(argv)


def _hooks_env(out: Path, sock: str) -> dict[str, str]:
    """Every hook, as in a supervised run: events to the agent, recorder dumps, SDC checks."""
    return dict(
        SENTINEL_AGENT_SOCKET=sock,
        SENTINEL_JOB="bench",
        SENTINEL_HOOKS_FR_DIR=str(out / "fr"),
        SENTINEL_HOOKS_EXCHANGE_EVERY=str(EXCHANGE_EVERY),
        SENTINEL_HOOKS_SDC_EVERY=str(SDC_EVERY),
        TORCH_FR_BUFFER_SIZE="2000",
    )


def reference_run(
    layout: Layout, on: bool, tmp: Path, name: str, steps: int, warmup: int, sock: str
) -> dict:
    """One whole run of the reference trainer; its timed window per step."""
    from trainer_hooks.reference.launch import run_gang

    out = tmp / name
    env = dict(os.environ, OMP_NUM_THREADS="1", SENTINEL_BENCH_WARMUP=str(warmup))
    if on:
        env.update(_hooks_env(out, sock))
    else:  # the bare trainer: no hooks, and no flight recorder either
        env.update(SENTINEL_HOOKS_ENABLED="0", TORCH_FR_BUFFER_SIZE="0")
    args = [*layout.argv(), "--steps", str(warmup + steps), "--out", str(out)]
    args += ["--data-dir", str(tmp / "corpus")]
    world = layout.world
    run_gang(world, args, log_dir=out / "logs", timeout=900, env=env, fork=True, entry=timed_rank)
    windows = [json.loads((out / f"window-{r}.json").read_text()) for r in range(world)]
    return {
        "step_s": statistics.median(w["wall_s"] for w in windows) / steps,
        "cpu_s": sum(w["cpu_s"] for w in windows) / steps,  # the whole gang's CPU per step
        "hook_errors": sum(w["hook_errors"] for w in windows),
    }


def whole_run_overhead(
    layout: Layout, tmp: Path, sock: str, pairs: int, steps: int, warmup: int, seed: int = 0
) -> dict[str, Any]:
    """Pairs of whole runs, hooks on and off, each pair in a random order; per-pair ratios of
    the timed windows' wall time and the gang's CPU time per step, and their medians."""
    rng = random.Random(seed)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(pairs):
        first = rng.random() < 0.5
        for on in (first, not first):
            name = f"pair{i}-{'on' if on else 'off'}"
            runs[on].append(reference_run(layout, on, tmp, name, steps, warmup, sock))
            r = runs[on][-1]
            print(
                f"whole run {name}: {r['step_s'] * 1e3:.1f} ms/step, gang CPU "
                f"{r['cpu_s'] * 1e3:.1f} ms/step, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    wall = [a["step_s"] / b["step_s"] for a, b in zip(runs[True], runs[False], strict=True)]
    cpu = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[True], runs[False], strict=True)]

    def med(arm: bool, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[arm]), 4)

    return {
        "whole_run_wall_ratio": round(statistics.median(wall), 4),
        "whole_run_cpu_ratio": round(statistics.median(cpu), 4),
        "whole_run_pair_wall_ratios": [round(r, 4) for r in wall],
        "whole_run_pair_cpu_ratios": [round(r, 4) for r in cpu],
        "whole_run_step_s_on": med(True, "step_s"),
        "whole_run_step_s_off": med(False, "step_s"),
        "whole_run_cpu_s_per_step_on": med(True, "cpu_s"),
        "whole_run_cpu_s_per_step_off": med(False, "cpu_s"),
        "whole_run_steps_each": steps * pairs,
        "whole_run_pairs": pairs,
        "whole_run_hook_errors": sum(r["hook_errors"] for r in runs[True]),
    }


def _arm_trimmed_mean(values: list[float], whole: list[bool], cut: float = 0.02) -> float:
    """Mean of an arm's steps, the top and bottom `cut` of the steps not kept `whole` dropped
    (preempted steps) and every step kept whole (periodic work and its twins: its cost counts)."""
    plain = sorted(v for v, w in zip(values, whole, strict=True) if not w)
    k = int(len(plain) * cut)
    kept = plain[k : len(plain) - k] + [v for v, w in zip(values, whole, strict=True) if w]
    return statistics.fmean(kept)


def _trimmed_ratio(steps: list[tuple[float, bool, bool]]) -> float:
    """On/off ratio of the arms' trimmed means; steps are (value, on, kept whole)."""
    means = []
    for on in (True, False):
        arm = [(v, p) for v, a, p in steps if a == on]
        means.append(_arm_trimmed_mean([v for v, _ in arm], [p for _, p in arm]))
    return means[0] / means[1]


def _bootstrap_ci(
    pairs: list[list[tuple[float, bool, bool]]], n: int = 1000, seed: int = 0
) -> list[float]:
    """95% interval of `_trimmed_ratio`, resampling whole pairs of blocks (each holds both
    arms, side by side in time, so the resampling keeps the pairing that cancels load drift)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        sample = [step for _ in pairs for step in rng.choice(pairs)]
        if {on for _, on, _ in sample} == {True, False}:
            ratios.append(_trimmed_ratio(sample))
    ratios.sort()
    return [round(ratios[int(0.025 * len(ratios))], 4), round(ratios[int(0.975 * len(ratios))], 4)]


def interleaved_overhead(
    layout: Layout,
    tmp: Path,
    sock: str,
    steps: int,
    warmup: int,
    block: int,
    seed: int = 0,
    save_records: Path | None = None,
) -> dict[str, Any]:
    """One run with `--hooks-interleave block`: the on/off ratios of the gang's time per
    step (the slowest rank's wall time; the gang's CPU time), over the steps after `warmup`."""
    from trainer_hooks.reference.launch import run_gang

    out = tmp / "interleaved"
    env = dict(os.environ, OMP_NUM_THREADS="1", **_hooks_env(out, sock))
    args = [*layout.argv(), "--steps", str(warmup + steps), "--out", str(out)]
    args += ["--data-dir", str(tmp / "corpus"), "--hooks-interleave", str(block)]
    args += ["--hooks-interleave-seed", str(seed)]
    world = layout.world
    run_gang(world, args, log_dir=out / "logs", timeout=1800, env=env, fork=True)
    recs = [json.loads((out / f"hooks-interleave-{r}.json").read_text()) for r in range(world)]
    if save_records is not None:
        save_records.write_text(json.dumps(recs))
    return analyze_interleaved(recs, warmup, block)


def analyze_interleaved(recs: list[dict[str, Any]], warmup: int, block: int) -> dict[str, Any]:
    """The figures of an interleaved run from its ranks' records (`hooks-interleave-R.json`).

    Trimming (see the module docstring) is paired: the steps kept whole are the on-steps with
    periodic work *and* their twins, the off-steps at the same place in the other block of the
    same pair. Preempted steps then survive at the same rate in both arms; keeping only the
    on-arm's periodic steps kept their outliers in one arm alone, a bias against the hooks that
    grows with the share of steps holding periodic work."""
    if any(r["on"] != recs[0]["on"] or r["periodic"] != recs[0]["periodic"] for r in recs):
        raise RuntimeError("interleaved run: ranks recorded different schedules")
    idx = [i for i, s in enumerate(recs[0]["steps"]) if s >= warmup]
    wall = [max(r["wall_s"][i] for r in recs) for i in idx]  # the slowest rank's step
    cpu = [sum(r["cpu_s"][i] for r in recs) for i in idx]  # the gang's CPU, all threads
    arm = [recs[0]["on"][i] for i in idx]
    kind = [recs[0]["periodic"][i] for i in idx]
    kind_at = dict(zip(recs[0]["steps"], recs[0]["periodic"], strict=True))
    kept_whole = [  # periodic on-steps and their off-arm twins
        (k if a else kind_at.get(twin(recs[0]["steps"][i], block))) is not None
        for i, a, k in zip(idx, arm, kind, strict=True)
    ]

    def pick(values: list[float], on: bool, kinds: tuple[str | None, ...] | None = None) -> list:
        return [
            v
            for v, a, k in zip(values, arm, kind, strict=True)
            if a == on and (kinds is None or k in kinds)
        ]

    def trimmed(values: list[float], on: bool) -> float:
        whole = [w for a, w in zip(arm, kept_whole, strict=True) if a == on]
        return _arm_trimmed_mean(pick(values, on), whole)

    def ms(values: list[float]) -> float | None:
        return round(statistics.fmean(values) * 1e3, 2) if values else None

    on_wall, off_wall = pick(wall, True), pick(wall, False)
    pairs: dict[int, list[tuple[float, bool, bool]]] = {}
    for i, w, a, whole in zip(idx, wall, arm, kept_whole, strict=True):  # 2 x block steps
        pairs.setdefault(recs[0]["steps"][i] // (2 * block), []).append((w, a, whole))
    return {
        "hook_overhead_ratio": round(trimmed(wall, True) / trimmed(wall, False), 4),
        "hook_overhead_ratio_ci95": _bootstrap_ci(list(pairs.values())),
        "hook_overhead_statistic": "interleaved run, gang step time (slowest rank's wall): "
        "on/off of each arm's mean, top/bottom 2% trimmed of the steps without periodic work "
        "in either block of their pair",
        "interleaved_mean_ratio": round(statistics.fmean(on_wall) / statistics.fmean(off_wall), 4),
        "interleaved_median_ratio": round(
            statistics.median(on_wall) / statistics.median(off_wall), 4
        ),
        "interleaved_cpu_ratio": round(trimmed(cpu, True) / trimmed(cpu, False), 4),
        "interleaved_cpu_mean_ratio": round(
            statistics.fmean(pick(cpu, True)) / statistics.fmean(pick(cpu, False)), 4
        ),
        "interleaved_step_ms_on": ms(on_wall),
        "interleaved_step_ms_off": ms(off_wall),
        "interleaved_step_ms_on_plain": ms(pick(wall, True, (None,))),
        "interleaved_step_ms_on_exchange": ms(pick(wall, True, ("exchange",))),
        "interleaved_step_ms_on_sdc": ms(pick(wall, True, ("sdc",))),
        "interleaved_gang_cpu_ms_on": ms(pick(cpu, True)),
        "interleaved_gang_cpu_ms_on_plain": ms(pick(cpu, True, (None,))),
        "interleaved_gang_cpu_ms_off": ms(pick(cpu, False)),
        "interleaved_steps_on": len(on_wall),
        "interleaved_steps_off": len(off_wall),
        "interleaved_periodic_steps": sum(k is not None for k in kind),
        "interleaved_sdc_checks": sum(k == "sdc" for k in kind),
        "interleaved_block": block,
        "interleaved_warmup_steps": warmup,
        "interleaved_fr_on_both_arms": True,
        "interleaved_hook_errors": sum(r["hook_errors"] for r in recs),
    }


def reference_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """The interleaved run, then the whole-run pairs, all sending events to one agent sink."""
    with tempfile.TemporaryDirectory(prefix="sentinel-bench-hooks-") as tmp_name:
        tmp = Path(tmp_name)
        sock = str(tmp / "agent.sock")
        sink = subprocess.Popen(
            [sys.executable, "-c", SINK, sock],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            t0 = time.monotonic()
            inter = interleaved_overhead(
                args.reference_layout,
                tmp,
                sock,
                args.interleaved_steps,
                args.reference_warmup,
                args.reference_block,
                save_records=args.save_records,
            )
            print(
                f"interleaved: on {inter['interleaved_step_ms_on']} ms/step, off "
                f"{inter['interleaved_step_ms_off']} ms/step, ratio {inter['hook_overhead_ratio']}"
                f" ({time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            whole = {}
            if args.whole_run_pairs:
                whole = whole_run_overhead(
                    args.reference_layout,
                    tmp,
                    sock,
                    args.whole_run_pairs,
                    args.whole_run_steps,
                    args.reference_warmup,
                )
        finally:
            batches, _ = sink.communicate("", timeout=30)
    layout = args.reference_layout
    return {
        **inter,
        **whole,
        "reference_layout": str(layout),
        "reference_ranks": layout.world,
        "reference_agent_batches": int(batches.strip() or 0),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1200, help="toy-loop steps")
    p.add_argument("--block", type=int, default=1, help="toy-loop steps per on/off block")
    p.add_argument("--warmup", type=int, default=20, help="toy-loop warm-up steps")
    p.add_argument(
        "--quick",
        action="store_true",
        help="400 toy steps, 160 interleaved reference steps, 2 whole-run pairs of 30",
    )
    p.add_argument("--no-reference", action="store_true", help="skip the reference-trainer runs")
    p.add_argument(
        "--interleaved-steps", type=int, default=None, help="timed interleaved steps (400)"
    )
    p.add_argument("--reference-block", type=int, default=2, help="--hooks-interleave BLOCK")
    p.add_argument(
        "--save-records",
        type=Path,
        default=None,
        help="write the interleaved run's per-rank step records here (JSON), for re-analysis "
        "with analyze_interleaved",
    )
    p.add_argument(
        "--whole-run-pairs", type=int, default=None, help="on/off whole-run pairs (3; 0: none)"
    )
    p.add_argument(
        "--whole-run-steps", type=int, default=None, help="timed steps per whole run (60)"
    )
    p.add_argument("--reference-warmup", type=int, default=6, help="untimed steps per run")
    p.add_argument(
        "--reference-layout",
        type=Layout.parse,
        default=Layout(),
        metavar="TPxPPxDP",
        help="the reference trainer's layout (2x2x2: 8 ranks, the demo's)",
    )
    args = p.parse_args()
    quick = args.quick
    if quick:
        args.steps = 400
    if args.interleaved_steps is None:
        args.interleaved_steps = 160 if quick else 400
    if args.whole_run_pairs is None:
        args.whole_run_pairs = 2 if quick else 3
    if args.whole_run_steps is None:
        args.whole_run_steps = 30 if quick else 60
    if min(args.interleaved_steps, args.whole_run_steps, args.reference_warmup) < 1:
        p.error("--interleaved-steps, --whole-run-steps and --reference-warmup must be >= 1")
    if args.reference_block < 1 or args.whole_run_pairs < 0:
        p.error("--reference-block must be >= 1 and --whole-run-pairs >= 0")
    load_start = os.getloadavg()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/times.json"
        mp.spawn(rank_main, args=(2, port, args, out), nprocs=2)
        data = json.loads(Path(out).read_text())
    on, off = statistics.median(data["on"]), statistics.median(data["off"])
    ratio = on / off
    mean_ratio = _trimmed_mean(data["on"]) / _trimmed_mean(data["off"])
    cpu_ratio = _trimmed_mean(data["cpu_on"]) / _trimmed_mean(data["cpu_off"])
    inside = statistics.fmean(data["inside"])  # every call, the periodic exchange included
    print(
        f"toy median step: hooks on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms "
        f"({len(data['on'])} each)",
        flush=True,
    )
    reference = {} if args.no_reference else reference_overhead(args)
    print(
        json.dumps(
            {
                **reference,
                "toy_hook_overhead_ratio": round(ratio, 4),
                "toy_trimmed_mean_ratio": round(mean_ratio, 4),
                "toy_cpu_time_ratio": round(cpu_ratio, 4),
                "hook_calls_ms_per_step": round(inside * 1e3, 4),
                "hook_calls_ms_median": round(statistics.median(data["inside"]) * 1e3, 4),
                "hook_calls_ms_p90": round(
                    sorted(data["inside"])[int(0.9 * len(data["inside"]))] * 1e3, 4
                ),
                "hook_calls_ratio": round((off + inside) / off, 4),
                "toy_step_ms_on": round(on * 1e3, 3),
                "toy_step_ms_off": round(off * 1e3, 3),
                "toy_steps_each": len(data["on"]),
                "toy_hook_errors": data["errors"],
                "load_avg_start": round(load_start[0], 2),
                "load_avg_end": round(os.getloadavg()[0], 2),
                "device": "cpu",
                "target": 1.01,
            }
        )
    )


if __name__ == "__main__":
    main()
