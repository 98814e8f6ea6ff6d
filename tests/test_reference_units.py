"""Fast, in-process checks of the reference trainer's pure parts (no process group)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sentinel.exitcodes import InputError
from sentinel.scenario import StragglerFault
from trainer_hooks.reference.checkpoint import COMMITTED, resolve_resume, step_dir
from trainer_hooks.reference.config import ConfigError, parse_config
from trainer_hooks.reference.data import (
    BatchLoader,
    Corpus,
    CorpusSpec,
    parse_skip_list,
    write_corpus,
)
from trainer_hooks.reference.faults import (
    SDC_EVERY,
    FaultInjector,
    load_faults,
    parse_fault_flag,
)
from trainer_hooks.reference.optim import LRSchedule
from trainer_hooks.sdc import matmul_digest


def test_skip_list_parsing() -> None:
    assert parse_skip_list("70-72, 95,,") == {70, 71, 72, 95}
    assert parse_skip_list("") == frozenset()
    for bad in ("7-3", "x", "1-y", "-4"):
        with pytest.raises(ValueError, match="skip-list"):
            parse_skip_list(bad)


def test_fault_flags_use_the_scenario_vocabulary() -> None:
    f = parse_fault_flag("straggler:rank=5,slowdown=1.3,at_step=30")
    assert isinstance(f, StragglerFault)
    assert (f.kind, f.rank, f.slowdown, f.at_step) == ("straggler", 5, 1.3, 30)
    for bad in ("sdc:rank=-1", "melt:rank=1", "crash:rank=1", "sdc:rank"):
        with pytest.raises(ValueError, match="--fault"):
            parse_fault_flag(bad)


@pytest.mark.parametrize(
    ("argv", "world", "msg"),
    [
        (["--tp", "2", "--pp", "2"], 8, None),
        (["--tp", "3"], 6, "--heads 4 must divide"),
        (["--pp", "8"], 8, "every stage needs a layer"),
        (["--pp", "4", "--accum", "2"], 4, "needs >= pp micro-batches"),
        (["--lr-scale", "0.5"], 1, "FACTOR:STEPS"),
        (["--lr-scale", "0:3"], 1, "FACTOR > 0"),
        (["--dp", "3"], 4, "must equal WORLD_SIZE=4"),
    ],
)
def test_config_validation(argv: list[str], world: int, msg: str | None, tmp_path: Path) -> None:
    argv = [*argv, "--out", str(tmp_path)]
    if msg is None:
        cfg = parse_config(argv, world)
        assert (cfg.tp, cfg.pp, cfg.dp, cfg.global_batch) == (2, 2, 2, 8)
        assert cfg.data_dir == tmp_path / "data"
        return
    with pytest.raises(ConfigError, match=msg):
        parse_config(argv, world)


def test_lr_schedule_warmup_cosine_and_scale_window() -> None:
    s = LRSchedule(peak=1.0, floor=0.1, warmup=4, total=14)
    assert [s.lr(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.lr(9) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 2)))
    assert s.lr(14) == pytest.approx(0.1) == s.lr(100)
    s.scale_from(5, 0.5, 2)
    assert [s.lr(i) / LRSchedule(1.0, 0.1, 4, 14).lr(i) for i in (4, 5, 6, 7)] == [1, 0.5, 0.5, 1]
    t = LRSchedule(1.0, 0.1, 4, 14)
    t.load_state_dict(s.state_dict())
    assert t == s


def test_sdc_makes_the_struck_devices_gemms_wrong_from_its_step(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(30, 20, generator=gen), torch.randn(20, 10, generator=gen)
    bias, x = torch.randn(10, generator=gen), torch.randn(2, 30, 20, generator=gen)
    lin = torch.nn.Linear(20, 10)
    ok = (a @ b, torch.addmm(bias, a, b), torch.bmm(x, x.transpose(1, 2)), lin(x), matmul_digest(3))
    faults = [parse_fault_flag("sdc:rank=0,at_step=2")]
    inj = FaultInjector(faults, 0, tmp_path, vocab=64)
    try:
        for step in (0, 1):
            inj.before_step(step)
            assert torch.equal(a @ b, ok[0]) and not inj.gemm.installed
        inj.before_step(2)
        bad = a @ b
        changed = (bad != ok[0]).flatten().nonzero().flatten().tolist()
        assert changed == list(range(0, 300, SDC_EVERY)), "one element in SDC_EVERY"
        rel = ((bad - ok[0]).abs() / ok[0].abs()).max().item()
        assert 0 < rel < 0.01, "slightly wrong: nothing a loss curve would show"
        assert not torch.equal(torch.addmm(bias, a, b), ok[1])
        assert not torch.equal(torch.bmm(x, x.transpose(1, 2)), ok[2])
        w = lin.weight.detach().clone().requires_grad_()
        out = torch.nn.functional.linear(x, w, lin.bias)  # through autograd, forward and back
        assert not torch.equal(out, ok[3])
        out.sum().backward()
        assert w.grad is not None and w.grad.shape == w.shape
        assert matmul_digest(3) != ok[4], "a spot check on the device sees it"
        assert (tmp_path / "faults" / "sdc-rank0-step2.fired").exists()
    finally:
        inj.gemm.uninstall()
    assert torch.equal(a @ b, ok[0]) and matmul_digest(3) == ok[4]


def test_sdc_stays_with_the_node_it_struck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults = [parse_fault_flag("sdc:rank=1,at_step=3")]
    monkeypatch.setenv("SENTINEL_NODE", "node-0")
    first = FaultInjector(faults, 1, tmp_path, vocab=64)
    other_rank = FaultInjector(faults, 0, tmp_path, vocab=64)
    try:
        first.before_step(5)
        other_rank.before_step(5)
        assert first.gemm.installed and not other_rank.gemm.installed
    finally:
        first.gemm.uninstall()
    monkeypatch.setenv("SENTINEL_NODE", "spare-0")  # a spare took rank 1 over after a rollback
    spare = FaultInjector(faults, 1, tmp_path, vocab=64)
    for step in range(2, 8):
        spare.before_step(step)
        assert not spare.gemm.installed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    d = tmp_path_factory.mktemp("corpus")
    write_corpus(d, CorpusSpec(vocab=64, tokens=20000, shards=3, seed=1))
    before = (d / "shard-000.bin").stat().st_mtime_ns
    write_corpus(d, CorpusSpec(vocab=64, tokens=20000, shards=3, seed=1))
    assert (d / "shard-000.bin").stat().st_mtime_ns == before, "written once"
    return Corpus(d)


def test_corpus_has_learnable_structure(corpus: Corpus) -> None:
    toks = np.concatenate([np.asarray(s) for s in corpus.shards]).astype(np.int64)
    pairs = np.zeros((64, 64))
    np.add.at(pairs, (toks[:-1], toks[1:]), 1)
    p = pairs / pairs.sum(1, keepdims=True).clip(1)
    h = -(pairs * np.log(np.where(p > 0, p, 1))).sum() / pairs.sum()
    assert h < 0.5 * math.log(64), "next token is far more predictable than uniform"


def test_global_batch_rows_do_not_depend_on_dp_width(corpus: Corpus) -> None:
    def loader(dp: int, rank: int) -> BatchLoader:
        return BatchLoader(corpus, seed=3, seq=8, mbs=2, accum=4 // dp, dp=dp, dp_rank=rank)

    whole = loader(1, 0).next()[1]
    halves = torch.cat([loader(2, r).next()[1] for r in (0, 1)])
    assert torch.equal(whole, halves)
    assert whole.shape == (8, 9)


def test_loader_skips_and_resumes_its_position(corpus: Corpus) -> None:
    a = BatchLoader(corpus, seed=3, seq=8, mbs=2, accum=2, dp=1, dp_rank=0)
    a.skip = frozenset({1, 2})
    assert [a.next()[0] for _ in range(3)] == [0, 3, 4]
    b = BatchLoader(corpus, seed=3, seq=8, mbs=2, accum=2, dp=1, dp_rank=0)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.next()[1], a.next()[1])
    c = BatchLoader(corpus, seed=3, seq=8, mbs=2, accum=4, dp=1, dp_rank=0)
    with pytest.raises(ValueError, match="global batch"):
        c.load_state_dict(a.state_dict())


def test_corrupt_batch_is_garbage_only_for_its_batch(tmp_path: Path) -> None:
    inj = FaultInjector([parse_fault_flag("corrupt_batch:batch=5")], 0, tmp_path, vocab=64)
    clean = torch.zeros(4, 9, dtype=torch.int64)
    assert inj.corrupt_batch(4, clean) is clean
    bad = inj.corrupt_batch(5, clean)
    assert bad.shape == clean.shape and bad.unique().numel() > 10
    assert torch.equal(bad, inj.corrupt_batch(5, clean)), "deterministic garbage"


def test_resume_resolution_ignores_torn_checkpoints(tmp_path: Path) -> None:
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    for tier, step, done in ((fast, 10, True), (fast, 20, False), (durable, 15, True)):
        d = step_dir(tier, step)
        d.mkdir(parents=True)
        if done:
            (d / COMMITTED).write_text("{}")
    assert resolve_resume("latest", [fast, durable]) == step_dir(durable, 15)
    assert resolve_resume("latest", [tmp_path / "none"]) is None
    with pytest.raises(FileNotFoundError, match="not a committed checkpoint"):
        resolve_resume(str(step_dir(fast, 20)), [fast])


def test_scenario_file_faults_keep_the_trainer_kinds(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        "fleet: {nodes: 2, gpus_per_node: 2, spares: 0}\n"
        "trainer: {tp: 2, pp: 1, dp: 2}\n"
        "faults:\n"
        "  - {kind: thermal, node: node-0, gpu: 1, temp_c: 96, at_step: 3}\n"
        "  - {kind: crash, rank: 2, at_step: 8}\n"
        "  - {kind: corrupt_batch, batch: 4}\n"
    )
    faults = load_faults(f, ("sdc:rank=1,at_step=2",))
    assert [x.kind for x in faults] == ["crash", "corrupt_batch", "sdc"]
    f.write_text("faults: [{kind: crash, rank: 99, at_step: 1}]\n")
    with pytest.raises(InputError, match=r"faults\.0\.rank: 99 >= world size"):
        load_faults(f, ())


def test_a_model_built_ahead_is_taken_and_leaves_the_same_random_state() -> None:
    """A warm spare builds its model while it waits (`prepare`); its generation takes it, and
    the random state after is the one building it then would have left: nothing can tell."""
    import torch

    from sentinel.ranks import current
    from trainer_hooks.reference.config import parse_config
    from trainer_hooks.reference.job import full_model
    from trainer_hooks.reference.train import prepare

    argv = [
        "--layers",
        "2",
        "--dim",
        "32",
        "--heads",
        "4",
        "--seq",
        "16",
        "--vocab",
        "128",
        "--out",
        "/tmp/unused",
        "--seed",
        "11",
    ]
    cfg = parse_config(argv, world=1)
    built = full_model(cfg)  # nothing prepared: built now
    after_building = torch.get_rng_state()
    current.set_prepared(prepare(argv))
    torch.manual_seed(0)  # whatever ran in between
    ready = full_model(cfg)
    assert torch.equal(torch.get_rng_state(), after_building)
    assert all(
        torch.equal(a, b) for a, b in zip(ready.parameters(), built.parameters(), strict=True)
    )
    assert current.take_prepared() is None  # taken once
    current.set_prepared(prepare([*argv[:-1], "12"]))  # another seed: not this model
    other = full_model(cfg)
    assert all(
        torch.equal(a, b) for a, b in zip(other.parameters(), built.parameters(), strict=True)
    )
    current.set_prepared(None)
