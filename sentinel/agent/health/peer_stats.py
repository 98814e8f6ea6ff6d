"""One signal compared across one node's GPUs, with what the node has learned about itself.

A single sweep of eight GPUs is a thin sample: the median and MAD of eight numbers wander by a
third from sweep to sweep, and a board position with poorer airflow runs a few degrees hotter
every hour of every day. Judged sweep by sweep, the first makes a noisy threshold and the
second a GPU flagged for where it sits. So each signal keeps, per node:

- each GPU's **place**: its usual deviation from the peers' median (`PeerSignal.place`), learned
  while the GPU is unremarkable and frozen while it is odd, so a fault is never learned in; how
  much a place can explain away is capped (`Signal.place_limit`): a GPU far off its peers from
  the first sweep on is still judged by the part past the cap;
- the node's **spread**: the MAD of the GPUs' deviations from their places, pooled over
  minutes of sweeps, so one sweep's tight or loose sample neither invents nor hides an outlier.

A deviation is a finding only past both the z-limit and the signal's least physical effect
(`Signal.min_effect`, or a share of the peers' median where the signal's noise grows with it:
`Signal.min_share`): eight GPUs that agree to the degree do not make the one 2 C off an
outlier. Pure Python: eight numbers per signal cost less than numpy's call overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sentinel.stats import MAD_SCALE, mad, median

# MAD of a handful of samples runs low: 1.4826 x MAD of 8 normal samples averages 0.89 sigma.
SMALL_SAMPLE = 1.13
MIN_PEERS = 4  # fewer GPUs than this in a comparison: no reference to be odd against
WARMUP_POLLS = 20  # sweeps after start that learn every GPU's place, odd or not
PLACE_POLLS = 3600  # a place follows slow change over ~an hour of sweeps (at 1 Hz)
PLACE_EVERY = 10  # once settled, a place learns from every 10th sweep: as good, a tenth the cost
SPREAD_POLLS = 300  # the pooled spread, over ~5 minutes of sweeps

# A GPU's score on one signal: (sweeps in a row it has been past the limit the same way; how
# odd, in the signal's bad direction; signed z; signal name; value; peers' median). Tuples
# compare streak first: the longest-standing anomaly names the GPU's finding.
Score = tuple[int, float, float, str, float, float]


@dataclass(frozen=True, slots=True)
class Signal:
    """How one signal is judged, in its own unit (C, MHz, W, errors per minute)."""

    name: str
    side: int  # +1: only above the peers is odd; -1: only below; 0: either way
    floor: float  # the least spread judged against
    min_effect: float  # the least deviation that is ever a finding
    place_limit: float  # the most a GPU's learned place explains away (0: places not learned)
    min_share: float = 0.0  # the least deviation as a share of the peers' median, if larger


@dataclass
class PeerSignal:
    """One signal on one node: each GPU's place among its peers and the node's pooled spread."""

    signal: Signal
    place: dict[int, float] = field(default_factory=dict)  # per unit of load
    learned: dict[int, int] = field(default_factory=dict)  # polls each place learned from
    spread: float | None = None  # pooled MAD of the deviations from place
    of_places: bool = False  # whether `spread` pools deviations from place (or raw values)
    pooled: int = 0  # polls pooled into `spread`
    streak: dict[int, int] = field(default_factory=dict)  # signed: sweeps past the limit
    polls: int = 0

    def score(
        self,
        values: dict[int, float],
        z_limit: float,
        worst: dict[int, Score],
        loads: dict[int, float] | None = None,
        learn: set[int] | None = None,
    ) -> None:
        """Score every GPU, keeping each GPU's strongest score in `worst`. A GPU's place is
        scaled by its load (`loads`, default 1: a place in the signal's unit) and learned only
        from the GPUs in `learn` (default all)."""
        if len(values) < MIN_PEERS:
            self.streak = {}
            return
        s, mid = self.signal, median(values.values())
        limit, place, learned = s.place_limit, self.place, self.learned
        rel: dict[int, float] = {}  # per unit of load
        dev: dict[int, float] = {}
        young: list[int] = []
        for g, x in values.items():
            load = loads[g] if loads is not None else 1.0
            r = rel[g] = (x - mid) / load
            if limit > 0 and learned.get(g, 0) < WARMUP_POLLS and (learn is None or g in learn):
                # Too young to tell odd from usual: learn first, so a GPU off its peers from
                # the start is judged by what its place cannot explain (past `place_limit`).
                self._learn(g, r)
                young.append(g)
            off = place.get(g, 0.0) * load  # a place explains away at most `limit`
            dev[g] = x - mid - (limit if off > limit else -limit if off < -limit else off)
        scale = max(s.floor, MAD_SCALE * SMALL_SAMPLE * self._spread(values, dev, young))
        least = max(s.min_effect, s.min_share * abs(mid))
        side, effect_z, last = s.side, z_limit / least, self.streak
        self.polls += 1
        settle = limit > 0 and self.polls % PLACE_EVERY == 0
        self.streak = streak = {}
        for g, d in dev.items():
            towards = abs(d) if side == 0 else max(0.0, side * d)
            # Past the z-limit and the least effect both, or not odd: half the least effect
            # scores at most half the limit (the clear condition).
            odd = min(towards / scale, effect_z * towards)
            run = 0
            if odd >= z_limit:  # the same way as last sweep continues a run; else starts one
                way, before = (1 if d > 0 else -1), last.get(g, 0)
                run = streak[g] = before + way if before * way > 0 else way
            score = (abs(run), odd, d / scale, s.name, values[g], mid)
            if g not in worst or score > worst[g]:
                worst[g] = score
            if settle and not run and g not in young and (learn is None or g in learn):
                self._learn(g, rel[g], PLACE_EVERY)  # follows slow change; an outlier: frozen

    def _learn(self, gpu: int, rel: float, every: int = 1) -> None:
        n = self.learned[gpu] = self.learned.get(gpu, 0) + 1
        last = self.place.get(gpu, 0.0)
        self.place[gpu] = last + (rel - last) / min(n, PLACE_POLLS // every)

    def _spread(self, values: dict[int, float], dev: dict[int, float], young: list[int]) -> float:
        """The MAD to judge this sweep by, pooled over sweeps: of the deviations from place of
        the GPUs whose places have settled; while too few have, of the values themselves (the
        places left in: a wider spread, the safe side), a pool of its own."""
        settled = [d for g, d in dev.items() if g not in young] if young else list(dev.values())
        of_places = len(settled) >= MIN_PEERS
        now = mad(settled if of_places else list(values.values()), scale=1.0)
        if of_places != self.of_places:  # the other kind of spread: pool afresh
            self.of_places, self.pooled = of_places, 0
        self.pooled += 1
        last = now if self.spread is None or self.pooled == 1 else self.spread
        self.spread = last + (now - last) / min(self.pooled, SPREAD_POLLS)
        return self.spread
