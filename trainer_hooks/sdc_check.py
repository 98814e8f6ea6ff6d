"""The SDC spot check across the gang: when a check falls due, every rank computes its digests
(`trainer_hooks.sdc`) after the same step and posts them in one gather; at its next hooked step
each rank judges them by majority and reports `rank.sdc`: the matmul check, and, with the model,
the data-parallel replicas' parameters.

It remembers the last step every rank agreed on: corruption found later may have spread into
every rank's state through the collectives since then, so the steps after it are suspect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from sentinel.protocol import EventKind, RankSdcPayload
from trainer_hooks import sdc
from trainer_hooks.config import HooksConfig
from trainer_hooks.exchange import GangExchange, Gathered

# What to do with a gather's rows once they are in, given the hooked step it is taken at.
Finish = Callable[[list[Any], int | None], None]
Send = Callable[[EventKind, BaseModel], None]


class SdcCheck:
    def __init__(
        self,
        config: HooksConfig,
        device: torch.device,
        model: nn.Module | None,
        send: Send,
        rank_offset: int = 0,
        replica_groups: list[list[int]] | None = None,
    ) -> None:
        """`rank_offset`: added to this world's ranks to name the job's ranks in reports;
        `replica_groups`: the ranks whose parameters must agree (default: every rank)."""
        self.config, self.device, self.model, self._send = config, device, model, send
        self.rank_offset, self.replica_groups = rank_offset, replica_groups
        self.requested_id: str | None = None  # the coordinator's id for a requested check
        self.first_step: int | None = None  # the first step this process ran
        self._clean_step: int | None = None  # the last step whose check every rank passed

    def saw_step(self, step: int) -> None:
        if self.first_step is None:
            self.first_step = step

    def start(self, step: int, exchange: GangExchange) -> tuple[Gathered[list[str]], Finish]:
        """Compute this rank's digests after `step` and post them; the finish judges them."""
        cfg = self.config
        requested, self.requested_id = self.requested_id, None
        check_id = requested or f"sdc-{step}"
        local = [sdc.matmul_digest(step, cfg.sdc_size, cfg.sdc_chain, self.device)]
        model = self.model if cfg.sdc_params else None
        if model is not None:
            local.append(sdc.param_digest(model))
        gathered = exchange.gather_digests(local)
        params, me = model is not None, exchange.rank
        return gathered, lambda rows, _: self._judge(step, check_id, params, me, rows)

    def _judge(
        self, step: int, check_id: str, params: bool, me: int, rows: list[list[str]]
    ) -> None:
        digests = [row[0] for row in rows]
        top, bad = sdc.majority(digests)
        since = self._suspect_since()
        self._report(step, check_id, "matmul", digests[me], me in bad, bad, since)
        clean = top is not None and not bad
        if params:
            clean = self._param_check(step, check_id, since, me, [row[1] for row in rows]) and clean
        if clean:
            self._clean_step = step

    def _suspect_since(self) -> int | None:
        """The first step after the last clean check (or this process's first step)."""
        if self._clean_step is not None:
            return self._clean_step + 1
        return self.first_step

    def _param_check(
        self, step: int, check_id: str, since: int | None, me: int, digests: list[str]
    ) -> bool:
        """Compare replicas' parameter digests (every rank's, by rank); False when some
        replica disagrees."""
        groups = self.replica_groups or [list(range(len(digests)))]
        clean = True
        for group in groups:
            if len(group) < 3:
                continue  # a majority needs at least three replicas
            _, bad_local = sdc.majority([digests[r] for r in group])
            clean = clean and not bad_local
            if me in group:
                bad = [group[i] for i in bad_local]
                mismatch = me in bad
                self._report(
                    step, f"{check_id}-params", "params", digests[me], mismatch, bad, since
                )
        return clean

    def _report(
        self,
        step: int,
        check_id: str,
        check: str,
        digest: str,
        mismatch: bool,
        bad: list[int],
        since: int | None,
    ) -> None:
        payload = RankSdcPayload(
            step=step,
            digest=digest,
            check_id=check_id,
            mismatch=mismatch,
            check=check,
            mismatched_ranks=[b + self.rank_offset for b in bad],
            suspect_since=since if mismatch else None,
        )
        self._send(EventKind.RANK_SDC, payload)
