"""The rules' precision corpus: every shipped stream replayed through the real agent rules and
the real coordinator (`sentinel rules score`), the scores file the coordinator gates its
destructive playbooks on kept current, and a playbook the corpus does not clear kept in shadow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from coord_util import ROOT, cfg, query, xid

from sentinel.coordinator.backends import make_backend
from sentinel.coordinator.core.clearance import DESTRUCTIVE_ACTIONS
from sentinel.coordinator.core.engine import Engine
from sentinel.coordinator.core.ingest import Ingestor
from sentinel.coordinator.core.operator import playbook_modes, set_playbook_mode
from sentinel.coordinator.core.playbooks import (
    PlaybookMode,
    default_playbooks_dir,
    load_playbooks,
)
from sentinel.coordinator.store import SqliteStore
from sentinel.precision.corpus import CORPUS_DIR, MIN_PRECISION, load_corpus
from sentinel.precision.gate import SHIPPED_SCORES, gate
from sentinel.precision.replay import replay_corpus
from sentinel.precision.score import Score, score
from sentinel.protocol import EventBatch

SENTINEL = [sys.executable, "-m", "sentinel"]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Score:
    books = load_playbooks(default_playbooks_dir())
    work = tmp_path_factory.mktemp("corpus")
    return score(replay_corpus(load_corpus(CORPUS_DIR), books, work), books)


def test_the_shipped_corpus_holds_every_bar(shipped: Score) -> None:
    doc = shipped.doc()
    assert doc["benign"] >= 15 and doc["faults"] >= 10
    assert shipped.destructive_on_benign == [] and shipped.recall == 1.0 and shipped.held
    # every shipped playbook that may evict or stop is measured, and clears the bar
    for book in load_playbooks(default_playbooks_dir()):
        if {s.action for s in book.steps} & DESTRUCTIVE_ACTIONS:
            measured = shipped.playbooks[book.name]
            assert measured.true >= 1 and (measured.precision or 0) >= MIN_PRECISION, book.name
    # what the corpus found, and is left to the rule: a 4 s NVLink flap is judged unhealthy
    assert shipped.rules["nvlink_down"].false_in == ["nvlink_flap"]


def test_the_scores_file_the_coordinator_gates_on_is_current(shipped: Score) -> None:
    """Change a rule, a playbook or a stream and this fails until the file is written again:
    `python -m sentinel rules score --json corpus/precision.json`."""
    assert json.loads(SHIPPED_SCORES.read_text()) == json.loads(json.dumps(shipped.doc()))


def _corpus(tmp_path: Path, **streams: str) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in streams.items():
        (corpus / f"{name}.yaml").write_text(text)
    return corpus


def test_a_false_alarm_is_counted_against_its_playbook_and_fails_the_score(
    tmp_path: Path,
) -> None:
    # mislabelled on purpose: a double-bit ECC error called benign is, to the corpus, a
    # benign stream the gpu_hardware_fault playbook evicted a node in
    corpus = _corpus(
        tmp_path,
        mislabelled=(
            "description: a DBE labelled benign\nlabel: benign\nduration_s: 30\n"
            "events:\n  - {t: 5, node: node-1, kind: ecc_dbe, gpu: 2}\n"
        ),
    )
    done = subprocess.run(
        [*SENTINEL, "rules", "score", "--corpus", str(corpus), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    hw = doc["playbooks"]["gpu_hardware_fault"]
    assert (hw["true"], hw["false"], hw["precision"]) == (0, 1, 0.0)
    assert hw["false_in"] == ["mislabelled"]
    assert doc["destructive_on_benign"] == [
        {
            "stream": "mislabelled",
            "playbook": "gpu_hardware_fault",
            "target": "node-1",
            "actions": ["evict_node"],
        }
    ]
    # the CLI's own gate, from that file: the playbook would run in shadow, and says why
    scores = tmp_path / "scores.json"
    scores.write_text(done.stdout)
    config = tmp_path / "config.yaml"
    config.write_text(f"coordinator:\n  precision_file: {scores}\n")
    check = subprocess.run(
        [*SENTINEL, "playbooks", "check", str(ROOT / "playbooks"), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    line = next(x for x in check.stdout.splitlines() if x.startswith("gpu_hardware_fault:"))
    assert "shadow: it may evict_node, and its precision on the rules corpus is 0.00" in line
    harmless = "rank_crash: ok (3 steps, priority 20); acts: it evicts and stops nothing"
    assert harmless in check.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("label: benign\nevents: []\n", "description: Field required"),
        (
            "description: d\nlabel: fault\nevents:\n  - {t: 1, node: node-1, kind: ecc_dbe, gpu: 0}\n",
            "a fault stream names the incidents it expects",
        ),
        (
            "description: d\nlabel: benign\nevents:\n  - {t: 1, node: node-7, kind: sbe, gpu: 0}\n",
            "events.0: no node 'node-7' in the fleet",
        ),
        (
            "description: d\nlabel: benign\nevents:\n  - {t: 1, node: node-1, kind: zap}\n",
            "kind: one of [",
        ),
        (
            "description: d\nlabel: benign\nevents:\n"
            "  - {t: 1, node: node-1, kind: event, event: rank.crash, payload: {exit_code: x}}\n",
            "events.0.payload.exit_code: Input should be a valid integer",
        ),
        (
            "description: d\nlabel: benign\nduration_s: 10\n"
            "events:\n  - {t: 30, node: node-1, kind: sbe, gpu: 0}\n",
            "t 30 is past duration_s 10",
        ),
    ],
)
def test_a_bad_stream_exits_2_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    corpus = _corpus(tmp_path, bad=text)
    done = subprocess.run(
        [*SENTINEL, "rules", "score", "--corpus", str(corpus)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert f"{corpus / 'bad.yaml'}:" in done.stderr and "Traceback" not in done.stderr


def test_a_playbook_the_corpus_does_not_clear_runs_in_shadow_until_an_operator_acts(
    tmp_path: Path,
) -> None:
    """The coordinator's own engine, gated on a scores file that measured gpu_hardware_fault at
    0.8: an XID 48 opens the incident and its run records the eviction without making it;
    after an operator switches the playbook to acting, the next one evicts."""
    shipped_scores = json.loads(SHIPPED_SCORES.read_text())
    shipped_scores["playbooks"]["gpu_hardware_fault"] |= {"true": 4, "false": 1, "precision": 0.8}
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps(shipped_scores))
    c = cfg(tmp_path, precision_file=scores)
    books = load_playbooks(default_playbooks_dir())
    gate(books, c.precision_file)
    store = SqliteStore(tmp_path / "state" / "coordinator.db")
    now = 1_000_000.0
    ingest = Ingestor(store, books, c)
    engine = Engine(store, books, c, make_backend(c), lambda: now)
    modes = {m["playbook"]: m for m in playbook_modes(store, books, c)}
    assert modes["gpu_hardware_fault"]["mode"] == "shadow"
    why = modes["gpu_hardware_fault"]["set_by"]
    assert "its precision on the rules corpus is 0.80 (4 true, 1 false), under 0.99" in why
    assert modes["straggler"]["mode"] == "acting"  # measured at 1.00 in the same file

    ingest.ingest(EventBatch(events=[xid("node-1")]), now)
    engine.tick()
    (step,) = query(store, "SELECT dry_run, state FROM actions WHERE action='evict_node'")
    assert step["dry_run"] and not (tmp_path / "state" / "exclude.txt").exists()

    set_playbook_mode(
        store, books, c, "gpu_hardware_fault", PlaybookMode.ACTING, "operator:alice", now
    )
    now += 10.0
    ingest.ingest(EventBatch(events=[xid("node-2")]), now)
    engine.tick()
    assert "node-2" in (tmp_path / "state" / "exclude.txt").read_text()
    store.close()
