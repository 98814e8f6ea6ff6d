"""Measured before it may act: a playbook that evicts or stops acts only when its trigger's
precision on the rules corpus is at or above `corpus.MIN_PRECISION`; otherwise it runs in shadow
(it decides and records every step and carries out none) and says why.

The measurements are the corpus's scores file (`sentinel rules score --json FILE`; the shipped
one is `corpus/precision.json`, which a test keeps equal to a fresh score of the shipped corpus
and playbooks). A playbook the file does not measure (no incident of it, true or false, in the
corpus) has no precision to show and stays in shadow. An operator's own switch (`sentinel playbooks act NAME`,
audited) still overrides it, as it overrides a playbook's `guards.dry_run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentinel.coordinator.core.clearance import DESTRUCTIVE_ACTIONS, Clearance
from sentinel.coordinator.core.playbooks import Playbook
from sentinel.exitcodes import InputError
from sentinel.inputs import read_json
from sentinel.precision.corpus import CORPUS_DIR, MIN_PRECISION

SHIPPED_SCORES = CORPUS_DIR / "precision.json"


def load_scores(path: Path | None) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The per-playbook scores of a scores file (None: the shipped one); InputError when it
    cannot be read as one."""
    where = path or SHIPPED_SCORES
    hint = "coordinator.precision_file: `sentinel rules score --json FILE` writes one"
    doc = read_json(where, hint)
    books = doc.get("playbooks") if isinstance(doc, dict) else None
    if not isinstance(books, dict) or not all(isinstance(v, dict) for v in books.values()):
        raise InputError(f"{where}: no per-playbook scores in it ({hint})")
    return where, books


def clearance(steps: list[str], measured: dict[str, Any] | None, source: Path) -> Clearance:
    """Whether a playbook with these step actions may act, by its measurement (None: absent)."""
    destructive = sorted(set(steps) & DESTRUCTIVE_ACTIONS)
    if not destructive:
        return Clearance(True, "it evicts and stops nothing")
    what = f"it may {' and '.join(destructive)}, and"
    if measured is None or not (measured.get("true") or measured.get("false")):
        return Clearance(False, f"{what} the rules corpus does not measure it ({source})")
    precision = float(measured.get("precision") or 0.0)
    counts = f"{measured['true']} true, {measured.get('false', 0)} false"
    if precision < MIN_PRECISION:
        return Clearance(
            False,
            f"{what} its precision on the rules corpus is {precision:.2f} ({counts}), "
            f"under {MIN_PRECISION} ({source})",
        )
    return Clearance(True, f"precision {precision:.2f} on the rules corpus ({counts})")


def gate(books: list[Playbook], path: Path | None) -> None:
    """Hold every playbook to the scores file `path` (None: the shipped one)."""
    source, scores = load_scores(path)
    for book in books:
        steps = [step.action for step in book.steps]
        book.gate(clearance(steps, scores.get(book.name), source))
