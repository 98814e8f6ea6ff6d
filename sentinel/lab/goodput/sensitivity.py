"""How far the headline moves with each input: every input halved and doubled, one at a time.

Each variant is replayed on the same failure streams as the headline (`Fleet` seeds), so a
difference is the input's alone. A model an input does not change is not replayed again.
"""

from __future__ import annotations

from dataclasses import dataclass

from sentinel.lab.goodput.inputs import Plan, build_models
from sentinel.lab.goodput.origin import Input
from sentinel.lab.goodput.simulate import Fleet

FACTORS = (0.5, 2.0)


@dataclass(frozen=True)
class Point:
    factor: float
    sentinel_ratio: float
    baseline_ratio: float

    @property
    def delta(self) -> float:
        return self.sentinel_ratio - self.baseline_ratio


@dataclass(frozen=True)
class Row:
    input: Input
    points: tuple[Point, ...]


def sensitivity(
    fleet: Fleet, rows: list[Input], plan: Plan, sentinel_ratio: float, baseline_ratio: float
) -> list[Row]:
    values = {r.key: r.value for r in rows}
    sen0, base0, _spec = build_models(values, plan)
    out = []
    for row in rows:
        points = []
        for factor in FACTORS:
            sen, base, _spec = build_models({**values, row.key: row.value * factor}, plan)
            points.append(
                Point(
                    factor,
                    sentinel_ratio if sen == sen0 else fleet.evaluate(sen).mean,
                    baseline_ratio if base == base0 else fleet.evaluate(base).mean,
                )
            )
        out.append(Row(row, tuple(points)))
    return out
