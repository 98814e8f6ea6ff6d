"""The fault-tolerant replica mode (`--replicas ft`): data-parallel replicas as fault domains.

Each replica is its own gang (a tp x pp world with its own rendezvous); the replicas are joined
by torchft, the field's engine for this (its lighthouse, one `Manager` per rank, a
reconfigurable process group, live state transfer). Per step every rank of every replica:

1. asks for the step's quorum (synchronously: a replica behind the others heals first, from a
   live peer, over torchft's HTTP checkpoint transport, never from a checkpoint);
2. trains on its share of the global batch: the quorum's live replicas split the batch's
   `dp x accum` micro-batches by their rank in the quorum (`shares`), so the batch is the same
   whatever the number of live replicas;
3. sums its micro-batch gradients divided by the micro-batches of the whole batch, and sums
   them across the replicas (the local shard of each gradient, in a few flat buckets);
4. clips, and asks torchft whether to commit: the optimizer steps only then. A step that does
   not commit (a replica died in it) is run again on the same global batch, in a new quorum.

A killed replica's peers see its sockets close (gloo fails the collective at once) and its
heartbeats stop; the lighthouse leaves it out of the next quorum after its heartbeat timeout.
A replica that stops answering but stays alive is seen only when a collective times out
(`ReplicaSettings.timeout_s`). Every committed step is recorded in the token ledger (ledger.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

from trainer_hooks.reference.config import NothingToHeal, TrainConfig

log = logging.getLogger(__name__)

HEARTBEAT = timedelta(milliseconds=100)  # how often a replica tells the lighthouse it lives
QUORUM_RETRY_S = 0.5  # pause before asking again after a quorum request failed
# The torchft step of a replica that holds nothing yet (`--ft-heal`): below every step a
# replica holding the model can be at, the seed's step 0 included, so any such peer is ahead.
HOLDS_NOTHING = -1


def shares(microbatches: int, participants: int, replicas: int) -> list[tuple[int, ...]]:
    """Contiguous shares of the micro-batches for quorum ranks 0..participants-1.

    With every replica live the shares are the ones a gang of `replicas` data-parallel ranks
    takes; with fewer, each live replica takes more. A quorum rank beyond `replicas` (two
    processes claiming one replica) gets none and only adds zeros."""
    width = min(participants, replicas)
    bounds = [i * microbatches // width for i in range(width + 1)]
    taken = [tuple(range(bounds[i], bounds[i + 1])) for i in range(width)]
    return taken + [()] * (participants - width)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a tensor (a DTensor's local part; a peer has the same layout)."""
    return (t.to_local() if isinstance(t, DTensor) else t).detach()


def model_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Parameters and optimizer state by parameter name, as this rank's local shards: a
    joining replica has the same layout, so each rank takes its counterpart's shards."""
    named = list(model.named_parameters())
    return {
        "params": {n: local(p) for n, p in named},
        "optim": {n: {k: local(v) for k, v in opt.state[p].items()} for n, p in named},
    }


@torch.no_grad()
def load_model_state(model: nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    for n, p in model.named_parameters():
        local(p).copy_(state["params"][n])
        mine = opt.state[p]  # empty in a replica that has not stepped yet
        for k, v in state["optim"][n].items():
            if k not in mine:
                # optimizer moments are shaped (and sharded) like the parameter; "step" is not
                mine[k] = torch.zeros_like(p) if v.shape == local(p).shape else v.clone()
            local(mine[k]).copy_(v)


@dataclass(frozen=True)
class StepPlan:
    """One attempt at a step: what this replica trains on in the step's quorum."""

    step: int
    batch: int
    quorum: int
    participants: int
    rank: int
    mine: tuple[int, ...]


@dataclass
class Roll:
    """The small record that rides at the end of the gradients' all-reduce: the global loss,
    and per quorum rank the replica, step and batch it trained (each quorum rank fills its own
    slot, the sum fills them all), so every replica learns who took which share and checks that
    all trained the same step on the same batch. In the gradients' dtype (fp32): an integer
    travels as two parts under 2**12 and 2**24, so each slot's sum (one value and zeros) is
    exact for integers under 2**36."""

    loss: float
    members: list[tuple[int, int, int]]  # per quorum rank: (replica, step, batch)

    SLOT = 5  # replica + 1, then step + 1 and batch + 1 in two parts each

    @classmethod
    def size(cls, participants: int) -> int:
        return 1 + cls.SLOT * participants

    @classmethod
    def encode(
        cls, plan: StepPlan, replica: int, loss: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor:
        t = torch.zeros(cls.size(plan.participants), device=device)
        if loss is not None:
            t[0] = loss.detach()  # stays on the device: no host sync
        step, batch = plan.step + 1, plan.batch + 1
        slot = 1 + cls.SLOT * plan.rank
        ints = [replica + 1, step >> 12, step & 4095, batch >> 12, batch & 4095]
        t[slot : slot + cls.SLOT] = torch.tensor(ints, dtype=torch.float32, device=device)
        return t

    @classmethod
    def decode(cls, t: torch.Tensor) -> Roll:
        values = [round(v) for v in t.cpu().tolist()[1:]]
        members = []
        for i in range(0, len(values), cls.SLOT):
            r, s_hi, s_lo, b_hi, b_lo = values[i : i + cls.SLOT]
            members.append((r - 1, (s_hi << 12) + s_lo - 1, (b_hi << 12) + b_lo - 1))
        return cls(float(t[0]), members)


class ReplicaLink:
    """This rank's end of the replicas' link: a torchft Manager and its process group.

    `state` and `load` give and take this rank's whole training state (`Job.replica_state`);
    torchft calls them to send it to a joining replica and to heal this one."""

    def __init__(
        self,
        cfg: TrainConfig,
        device: torch.device,
        state: Callable[[], dict[str, Any]],
        load: Callable[[dict[str, Any]], None],
        step: int,
    ) -> None:
        assert cfg.ft is not None, "the replica mode's settings"
        self.settings = settings = cfg.ft
        self.replicas, self.microbatches = cfg.dp, cfg.microbatches
        self.device = device
        self._state: Callable[[], dict[str, Any]] | None = state
        self._load: Callable[[dict[str, Any]], None] | None = load
        self.timeout = timedelta(seconds=settings.timeout_s)  # the process group's and manager's
        pg = ProcessGroupNCCL if device.type == "cuda" else ProcessGroupGloo
        self.pg = pg(self.timeout)
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self._manager: Manager | None = None  # made at the first quorum (`_join`)
        self.plan: StepPlan | None = None
        self.healed: dict[str, Any] | None = None  # this attempt's heal: from which step, when
        self.assignment: dict[int, tuple[int, ...]] = {}  # the last reduce's replica -> share
        self._before = step

    def _send(self) -> dict[str, Any]:
        assert self._state is not None, "closed"
        return self._state()

    def _heal(self, state: dict[str, Any]) -> None:
        assert self._load is not None, "closed"
        t0 = time.perf_counter()
        self._load(state)
        self.healed = {"from_step": self._before, "load_s": time.perf_counter() - t0}

    @property
    def manager(self) -> Manager:
        assert self._manager is not None, "start() makes the manager"
        return self._manager

    @property
    def step(self) -> int:
        return self.manager.current_step()

    def _join(self) -> None:
        """Make this rank's torchft Manager, which starts the replica's heartbeats, only now,
        at its first quorum. The lighthouse holds a quorum for every replica that heartbeats
        and has not asked yet (up to `join_timeout_ms`): a replacement that heartbeats from its
        build on would hold its running peers' next quorum for as long as it takes to get to
        its first step (5.5 s in a loaded drill, against their 5 s target)."""
        settings = self.settings
        self._manager = Manager(
            pg=self.pg,
            load_state_dict=self._heal,
            state_dict=self._send,
            min_replica_size=1,
            use_async_quorum=False,  # heal before the step, then train in it at full width
            timeout=self.timeout,
            quorum_timeout=timedelta(seconds=settings.quorum_timeout_s),
            connect_timeout=timedelta(seconds=settings.connect_timeout_s),
            rank=self._rank,
            world_size=self._world,
            lighthouse_addr=settings.lighthouse,
            replica_id=f"replica-{settings.replica}",
            heartbeat_interval=HEARTBEAT,
            init_sync=False,  # every replica builds the same initial model from the seed
        )
        step = HOLDS_NOTHING if settings.heal else self._before
        self._manager.load_state_dict({"step": step, "batches_committed": 0})

    def start(self, leave: Callable[[], bool]) -> bool:
        """The step's quorum; a replica behind the others heals in it (`healed` then says from
        which step, how long the quorum with the transfer took and the load). A failed quorum
        request (the lighthouse unreachable, this replica left out) is asked again, until
        `leave()` says this replica is to leave its generation: then False. A replica launched
        to heal (`--ft-heal`) whose quorum holds no replica with the model raises
        `NothingToHeal`."""
        self.healed, self.plan, self.assignment = None, None, {}
        if self._manager is None:
            self._join()
        self._before = self.step
        while True:
            t0 = time.perf_counter()
            try:
                self.manager.start_quorum()
                break
            except Exception as e:
                log.warning("replica %d: quorum failed: %s", self.settings.replica, e)
                # torchft re-raises the last quorum's error on every later request otherwise
                self.manager._quorum_future = None
                if leave():
                    return False
                time.sleep(QUORUM_RETRY_S)
        if self.healed is not None:
            self.healed["quorum_s"] = time.perf_counter() - t0
        elif self.step == HOLDS_NOTHING and self.manager.errored() is None:
            # (a heal that failed leaves the step behind too, with an error: that step is
            # not committed and the next quorum heals again)
            raise NothingToHeal(
                f"replica {self.settings.replica} joined to heal from a live peer, but no "
                "replica in its quorum holds the model (each was lost or is still joining); "
                "the job must restart from a checkpoint"
            )
        return True

    def assign(self, batch: int) -> StepPlan:
        """This replica's share of `batch` in the step's quorum."""
        rank = self.manager.participating_rank()
        n = self.manager.num_participants()
        assert rank is not None, "a synchronous quorum always includes the replica that asked"
        mine = shares(self.microbatches, n, self.replicas)[rank]
        quorum = self.manager._quorum_id  # the ledger names it; torchft has no public getter
        self.plan = StepPlan(self.step, batch, quorum, n, rank, mine)
        return self.plan

    @torch.no_grad()
    def reduce(self, model: nn.Module, loss: torch.Tensor | None) -> torch.Tensor | None:
        """Sum every gradient's local shard and the loss over the quorum's replicas.

        One all-reduce per step, of every gradient and the roll in one flat fp32 buffer: with
        several, a replica whose first one failed (a peer died) would give up on the rest while
        a peer whose first one failed later, or not at all, waits in the next on the one that
        gave up, until the torchft timeout."""
        plan = self.plan
        assert plan is not None, "assign() before reduce()"
        for p in model.parameters():
            if p.grad is None:  # a replica with no share computed no gradient
                p.grad = torch.zeros_like(p)
        grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
        roll = Roll.encode(plan, self.settings.replica, loss, self.device)
        flat = torch.cat([*(g.reshape(-1).float() for g in grads), roll])
        work = self.manager.allreduce(flat, reduce_op=dist.ReduceOp.SUM)
        if not work.wait() or self.manager.errored():
            # Not committed: the gradients are dropped. This replica lets go of the failed
            # group now rather than at the next quorum: its links close, and a peer still
            # waiting in the same all-reduce on this replica fails at once instead of holding
            # up the next quorum for the lighthouse's join timeout (a peer that died took one
            # link; the others are this replica's).
            del work
            self.pg.abort()
            return loss
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        seen = Roll.decode(flat[offset:])
        if any((s, b) != (plan.step, plan.batch) for _, s, b in seen.members):
            self.manager.report_error(
                RuntimeError(f"replicas disagree on step {plan.step}: {seen.members}")
            )
        split = shares(self.microbatches, plan.participants, self.replicas)
        self.assignment = {r: split[i] for i, (r, _, _) in enumerate(seen.members) if split[i]}
        return None if loss is None else torch.tensor(seen.loss, device=loss.device)

    def commit(self) -> bool:
        """torchft's vote (every rank of this replica agrees). The run's first step waits for
        every replica, so a run starts at full width and an uninterrupted run is repeatable."""
        plan = self.plan
        assert plan is not None
        if plan.step == 0 and plan.participants < self.replicas:
            self.manager.report_error(RuntimeError("the first step waits for every replica"))
        try:
            committed = self.manager.should_commit()
        except Exception as e:  # the vote itself failed (a rank of this replica is gone)
            log.warning("replica %d: commit vote failed: %s", self.settings.replica, e)
            committed = False
        if not committed and self.healed is not None:
            # The heal's state may have landed on some of this replica's ranks and not on
            # others: be behind again, so the next quorum heals every rank afresh.
            self.manager.load_state_dict(
                {"step": self._before, "batches_committed": self.manager.batches_committed()}
            )
        return committed

    def error(self) -> str | None:
        err = self.manager.errored()
        e = None if err is None else err.original_exception
        return None if e is None else f"{type(e).__name__}: {e}"[:300]

    def close(self) -> None:
        """Leave: stop the manager's server, heartbeats, state server and threads, and let go
        of the training state, so that nothing holds the job (its process groups, its store)
        once the entry point returns: a warm host's next generation starts clean. torchft's
        process-wide timeout service (two daemon threads, started on first use) stays and
        serves the next generation."""
        if self._manager is not None:
            self._manager.shutdown(wait=True)
        self.pg.abort()
        self._state = self._load = None
