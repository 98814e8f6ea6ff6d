"""`sentinel demo --quick`: the same drill in fewer steps, every repair still proven.

Two cuts. (1) The timed faults move earlier, all by one shift: a whole number of checkpoint
intervals, so each fault keeps its place between checkpoints and its order and spacing from the
others (a repair rolls back to the checkpoint before its fault, and the next fault then strikes
as many steps into the new generation as in the full drill). The shift stops where a fault
would strike before its detector can see it (`earliest`). (2) Training stops two checkpoint
intervals after the last repair can be proven (`needed_after`), or one where two would cut
nothing, and never later than the full drill's own end, moved by the same shift.

Nothing about the detectors changes: the hooks' settings are the drill's (`run.hooks_env`), the
playbooks the shipped ones.
"""

from __future__ import annotations

from sentinel.lab.demo.run import drill_hooks
from sentinel.scenario import CorruptBatchFault, Fault, Scenario, SdcFault, StragglerFault

# Mirrors of trainer_hooks' shipped settings (`sentinel` does not import `trainer_hooks`; a test
# checks they match): the loss-spike detector's warm-up, in loss values (anomaly.RobustSpike),
# the windows that set each rank's normal before it is judged from a run's first step, and the
# slow windows a straggler needs before it reports (HooksConfig).
LOSS_SPIKE_WARMUP = 8
STRAGGLER_BASELINE = 4
STRAGGLER_OVER = 3
# The earliest batch a corrupt batch can be told from the loss curve of the demo's model. Past
# the warm-up the loss must also have come down from its first plunge: a batch of random tokens
# must stand above the threshold (the last 8 values' median + 8 MADs of the step-to-step
# changes, and at least 1.3 x that median). Measured on each replica of the demo model (TP2 x
# DP2, seed 7; training is deterministic, so the curve is the same every run): a corrupt batch
# 25 is flagged by one replica of two, by 1% (5.30 over 5.23); batch 30 by both, 16% over
# (5.32 over 4.58); 35 by 16%; 40 by 28%.
CORRUPT_BATCH_EARLIEST = 30


def strike_step(fault: Fault) -> int | None:
    """The trainer's loop index a timed fault strikes at (a corrupt batch: its batch number,
    which the loop reads at that index before a skip list); None for a fault before launch."""
    if isinstance(fault, CorruptBatchFault):
        return fault.batch
    return getattr(fault, "at_step", None)


def earliest(fault: Fault, every: int) -> int:
    """The earliest step `fault` may strike in a shortened drill and still be found and
    repaired as in the full one."""
    if isinstance(fault, CorruptBatchFault):
        return max(CORRUPT_BATCH_EARLIEST, LOSS_SPIKE_WARMUP)
    # A repair rolls back to a committed checkpoint: the first one is saved at `every` and
    # committed at a step boundary after its asynchronous write, a step or two later.
    return every + 2


def needed_after(fault: Fault, every: int) -> int:
    """Steps after the strike within which the repaired gang passes the strike's step again:
    one checkpoint interval (the rollback's checkpoint is at most that far back); for a
    straggler first the windows that set the ranks' normals if it struck while they were
    being set, the slow windows it needs to report (one more if it struck mid-window) and the
    exchange that carries them,
    and the checkpoint its node's swap waits for; for SDC first the spot check that sees it
    (every `sdc_every` steps) and the exchange after it, where every rank recomputes the step to
    name the culprit, then the interval (a restart ordered after the last step comes too late:
    the run would end with the corrupt model)."""
    hooks = drill_hooks()
    if isinstance(fault, StragglerFault):
        window = int(hooks["straggler_window"])
        settling = max(0, window * STRAGGLER_BASELINE - fault.at_step)
        judged = window * (STRAGGLER_OVER + bool(fault.at_step % window))
        scoring = settling + judged + int(hooks["exchange_every"])
        return scoring + 2 * every
    if isinstance(fault, SdcFault):
        check = int(hooks["sdc_every"])
        seen = (fault.at_step // check + 1) * check - fault.at_step
        return seen + int(hooks["exchange_every"]) + every
    return every


def _moved(fault: Fault, shift: int) -> Fault:
    if isinstance(fault, CorruptBatchFault):
        return fault.model_copy(update={"batch": fault.batch - shift})
    if strike_step(fault) is None:
        return fault
    return fault.model_copy(update={"at_step": getattr(fault, "at_step") - shift})  # noqa: B009


def quick(scenario: Scenario) -> Scenario:
    """The scenario with its timed faults moved earlier and its training cut (module doc)."""
    every = scenario.trainer.checkpoint_every or scenario.trainer.steps
    timed = [(f, s) for f in scenario.faults if (s := strike_step(f)) is not None]
    room = min(((s - earliest(f, every)) // every for f, s in timed), default=0)
    shift = max(0, room) * every
    full = scenario.trainer.steps - shift
    proven = max(
        (s - shift + needed_after(_moved(f, shift), every) for f, s in timed), default=every
    )
    steps = proven + every if proven + every < full else min(full, proven)
    trainer = scenario.trainer.model_copy(update={"steps": max(1, steps)})
    faults = [_moved(f, shift) for f in scenario.faults]
    return scenario.model_copy(update={"trainer": trainer, "faults": faults})


def summary(full: Scenario, short: Scenario) -> str:
    """One line for the timeline: what --quick changed."""
    pairs = zip(full.faults, short.faults, strict=True)
    moved = [(strike_step(a), strike_step(b)) for a, b in pairs if strike_step(a) is not None]
    shift = (moved[0][0] or 0) - (moved[0][1] or 0) if moved else 0
    earlier = f", timed faults {shift} steps earlier" if shift else ""
    return f"--quick: {short.trainer.steps} of {full.trainer.steps} steps{earlier}"
