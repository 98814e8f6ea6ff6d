"""Which rank is stuck, and in what: cross-rank matching of flight-recorder dumps.

Per process group, every member's last issued collective sequence number is compared. A
collective `s` that some members issued and others did not is where the group is stuck: the
members at or past `s` wait on those still at `s - 1`. Across groups this gives a wait-for
relation, and the root cause is a rank that others wait on while it waits on nobody — a rank
behind in the world group because it is itself blocked in a subgroup is a victim, not a cause.
If everybody waits on somebody, the ranks issued collectives in different orders (a mismatch).
Collectives every member issued are also compared entry by entry (op, input sizes, dtypes); the
minority at the earliest disagreement is the culprit of a mismatch.

A rank with no dump, or an unreadable one, is evidence too: the rank that raised the error tears
its process group down and often never dumps. When the ranks present wait in a collective of a
group the absent rank belongs to, the absent rank is named the likely culprit, and the report
says that the verdict rests on the absence (`evidence: "missing_dump"`).

Membership of each group comes from the dumps' `pg_config` (NCCL), from Sentinel's sidecars
(gloo dumps carry none), or failing both from which dumps mention the group; the default group
spans all ranks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sentinel.fr.dumps import DumpDir, GroupState, RankSummary, Signature

# Ops whose inputs must have the same shape on every member.
SAME_SIZE_OPS = ("all_reduce", "broadcast", "reduce", "allreduce", "_allgather_base", "all_gather")
# Only the root passes tensors in: the other members' entries record no input dtypes.
ROOT_INPUT_OPS = ("scatter",)


@dataclass
class Group:
    name: str
    desc: str
    ranks: list[int]


@dataclass
class Stuck:
    group: Group
    seq: int
    op: str | None
    waiting: list[int]
    behind: list[int]
    issued_ns: int | None  # when the first waiting rank issued it (None: not in the buffers)


@dataclass
class Report:
    verdict: str
    culprit_ranks: list[int] = field(default_factory=list)
    waiting_ranks: list[int] = field(default_factory=list)
    collective: dict[str, Any] | None = None
    reason: str = ""
    missing_ranks: list[int] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    wrapped_ranks: list[int] = field(default_factory=list)
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    stuck_groups: list[dict[str, Any]] = field(default_factory=list)
    ranks_analyzed: int = 0
    versions: list[str] = field(default_factory=list)
    # What the verdict rests on: "dumps" (recorded collectives) or "missing_dump" (the ranks
    # present wait on ranks that left no readable dump).
    evidence: str = "dumps"

    def to_json(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["unreadable"] = {str(k): v for k, v in self.unreadable.items()}
        return d


def build_groups(dumps: DumpDir) -> dict[str, Group]:
    members: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    known: set[str] = set()  # membership from a config, not inferred
    configs = all_configs(dumps)
    pairs = {(name, key) for s in dumps.summaries.values() for name, key in s.pg_config.items()}
    for name, key in pairs:
        if key in configs:
            members.setdefault(name, set()).update(configs[key])
            known.add(name)
    for meta in dumps.sidecars.values():
        for name, pg in (meta.get("process_groups") or {}).items():
            members.setdefault(name, set()).update(int(r) for r in pg.get("ranks", []))
            descs.setdefault(name, str(pg.get("desc", "")))
            known.add(name)
    world = expected_world(dumps)
    for s in dumps.summaries.values():
        for name, g in s.groups.items():
            if name not in descs:
                descs[name] = g.desc
                if g.desc == "default_pg":  # the default group spans the world
                    members.setdefault(name, set()).update(range(world))
                    known.add(name)
            if name not in known:
                members.setdefault(name, set()).add(s.rank)
    return {n: Group(n, descs.get(n, ""), sorted(r)) for n, r in members.items()}


def all_configs(dumps: DumpDir) -> dict[str, list[int]]:
    return {k: v for s in dumps.summaries.values() for k, v in s.configs.items()}


def expected_world(dumps: DumpDir) -> int:
    sizes = [int(m["world_size"]) for m in dumps.sidecars.values() if m.get("world_size")]
    top = max([*dumps.summaries, *dumps.unreadable, *dumps.sidecars], default=-1) + 1
    for ranks in all_configs(dumps).values():
        top = max(top, max(ranks) + 1)
    return max([top, *sizes])


def find_stuck(groups: dict[str, Group], summaries: dict[int, RankSummary]) -> list[Stuck]:
    stuck = []
    for g in groups.values():
        seqs = {}
        for r in g.ranks:
            s = summaries.get(r)
            if s is None:
                continue
            state = s.groups.get(g.name)
            seq = state.seq if state is not None else 0
            if state is None and s.wrapped:
                continue  # the group's entries may have been overwritten: unknown, not zero
            seqs[r] = seq if seq is not None else 0
        if len(set(seqs.values())) < 2:
            continue
        low = min(seqs.values())
        waiting = sorted(r for r, q in seqs.items() if q > low)
        behind = sorted(r for r, q in seqs.items() if q == low)
        op = _op_at(summaries, waiting, g.name, low + 1)
        times = [t for r in waiting if (t := summaries[r].groups[g.name].created_ns.get(low + 1))]
        stuck.append(Stuck(g, low + 1, op, waiting, behind, min(times, default=None)))
    return stuck


def _op_at(summaries: dict[int, RankSummary], ranks: list[int], pg: str, seq: int) -> str | None:
    for r in ranks:
        ops = summaries[r].groups[pg].ops.get(seq)
        if ops:
            return ops[0][0]
    return None


def find_mismatches(groups: dict[str, Group], summaries: dict[int, RankSummary]) -> list[dict]:
    found = []
    cache: dict[tuple[Signature, ...], tuple[Signature, ...]] = {}
    for g in groups.values():
        by_seq: dict[int, dict[int, tuple[Signature, ...]]] = {}
        for r in g.ranks:
            state = summaries[r].groups.get(g.name) if r in summaries else None
            if state is None:
                continue
            for seq, sigs in state.ops.items():
                key = tuple(sigs)
                comparable = cache.get(key)
                if comparable is None:
                    comparable = cache[key] = tuple(_comparable(s) for s in sigs)
                by_seq.setdefault(seq, {})[r] = comparable
        for seq in sorted(by_seq):
            sigs_by_rank = by_seq[seq]
            if len(sigs_by_rank) < 2:
                continue
            counts = Counter(sigs_by_rank.values())
            if len(counts) == 1:
                continue
            majority, n = counts.most_common(1)[0]
            odd = sorted(r for r, sig in sigs_by_rank.items() if sig != majority)
            if n * 2 <= len(sigs_by_rank):
                odd = sorted(sigs_by_rank)  # no majority: everyone is suspect
            found.append(
                {
                    "pg": g.name,
                    "pg_desc": g.desc,
                    "seq": seq,
                    "expected": _describe(majority),
                    "ranks": {str(r): _describe(sigs_by_rank[r]) for r in odd},
                    "culprit_ranks": odd,
                }
            )
            break  # later collectives of a group that already disagreed prove nothing more
    return found


def _comparable(sig: Signature) -> Signature:
    op, sizes, dtypes = sig
    base = op.split(":")[-1]
    return (
        op,
        sizes if base in SAME_SIZE_OPS else "",
        "" if base in ROOT_INPUT_OPS else dtypes,
    )


def _describe(sigs: tuple[Signature, ...]) -> str:
    return "; ".join(f"{op} sizes={sizes} dtypes={dt}" for op, sizes, dt in sigs)


def analyze(dumps: DumpDir) -> Report:
    """The verdict on a job's dumps. A job of several worlds (data-parallel replicas, each a
    process group world of its own: the sidecars say `world` and `rank_offset`) is judged world
    by world, whose groups share names but not members; ranks come back as the job's."""
    worlds = split_worlds(dumps)
    if len(worlds) <= 1:
        return analyze_world(dumps)
    reports = {offset: analyze_world(part) for offset, part in worlds.values()}
    return merge_reports(reports)


_VERDICT_ORDER = ("hang", "mismatch", "incomplete", "ok")


def split_worlds(dumps: DumpDir) -> dict[str, tuple[int, DumpDir]]:
    """{world: (its rank offset, its dumps by its own ranks)}; one entry for a single world."""
    label: dict[int, tuple[str, int]] = {}
    for rank, meta in dumps.sidecars.items():
        if isinstance(meta.get("world"), str):
            label[rank] = (meta["world"], int(meta.get("rank_offset") or 0))
    if len({w for w, _ in label.values()}) <= 1:
        return {"": (0, dumps)}
    out: dict[str, tuple[int, DumpDir]] = {}
    for world, offset in sorted(set(label.values()), key=lambda x: x[1]):
        mine = {r for r, lab in label.items() if lab == (world, offset)}

        def local(d: dict[int, Any], mine: set[int] = mine, offset: int = offset) -> dict[int, Any]:
            return {r - offset: v for r, v in d.items() if r in mine}

        part = DumpDir(
            local(dumps.summaries), local(dumps.sidecars), local(dumps.unreadable), dumps.prefix
        )
        out[world] = (offset, part)
    return out


def merge_reports(reports: dict[int, Report]) -> Report:
    """One report of several worlds' (by rank offset): the gravest verdict, every rank as the
    job's, each world's stuck groups and mismatches."""

    def job(ranks: list[int], offset: int) -> list[int]:
        return [r + offset for r in ranks]

    worst = min(reports.items(), key=lambda kv: _VERDICT_ORDER.index(kv[1].verdict))
    offset, head = worst
    merged = Report(
        verdict=head.verdict,
        culprit_ranks=job(head.culprit_ranks, offset),
        waiting_ranks=job(head.waiting_ranks, offset),
        collective=head.collective,
        reason=head.reason,
        evidence=head.evidence,
    )
    for off, rep in sorted(reports.items()):
        merged.missing_ranks += job(rep.missing_ranks, off)
        merged.unreadable |= {r + off: why for r, why in rep.unreadable.items()}
        merged.wrapped_ranks += job(rep.wrapped_ranks, off)
        merged.mismatches += rep.mismatches
        merged.stuck_groups += rep.stuck_groups
        merged.ranks_analyzed += rep.ranks_analyzed
        merged.versions = sorted(set(merged.versions) | set(rep.versions))
    return merged


def analyze_world(dumps: DumpDir) -> Report:
    """The verdict on one process-group world's dumps (ranks as the world's)."""
    summaries = dumps.summaries
    groups = build_groups(dumps)
    world = expected_world(dumps)
    missing = sorted(set(range(world)) - set(summaries) - set(dumps.unreadable))
    report = Report(
        verdict="ok",
        missing_ranks=missing,
        unreadable=dict(dumps.unreadable),
        wrapped_ranks=sorted(r for r, s in summaries.items() if s.wrapped),
        ranks_analyzed=len(summaries),
        versions=sorted({s.version for s in summaries.values()}),
    )
    absent = sorted(set(missing) | set(dumps.unreadable))
    mismatches = find_mismatches(groups, summaries)
    stuck = find_stuck(groups, summaries)
    report.mismatches = mismatches
    report.stuck_groups = [_stuck_json(s) for s in stuck]
    if mismatches:
        _blame_mismatch(report, mismatches[0], groups)
    elif stuck:
        _blame_hang(report, stuck)
        held = _waiting_on_absent(groups, summaries, absent)
        # The ranks the record blames wait themselves, on ranks that left no dump: the root.
        chains = _chains_to_absent(report.culprit_ranks, stuck, held, groups, world) if held else []
        if chains:
            _blame_absence(report, held, summaries, chains)
            return report
    elif held := _waiting_on_absent(groups, summaries, absent):
        _blame_absence(report, held, summaries)
        return report
    elif absent:
        report.culprit_ranks = absent
        report.waiting_ranks = sorted(summaries)
        report.reason = "no disagreement among the dumps present; the absent ranks are suspects"
    else:
        report.reason = "every group's members issued the same collectives"
    if absent:
        report.verdict = "incomplete"
        report.reason = f"dumps missing or unreadable for ranks {absent}; " + report.reason
    return report


def _unfinished(state: GroupState | None, seq: int) -> bool:
    """The rank has not seen collective `seq` complete (or its dump cannot say)."""
    return state is not None and (state.completed is None or state.completed < seq)


Held = tuple[Group, int, list[int], list[int]]  # group, seq, absent members, waiting members


def _waiting_on_absent(
    groups: dict[str, Group], summaries: dict[int, RankSummary], absent: list[int]
) -> list[Held]:
    """Groups holding ranks with no readable dump in whose latest collective present members
    wait (issued it and did not see it complete)."""
    found: list[Held] = []
    for g in groups.values():
        gone = [r for r in g.ranks if r in absent]
        seqs = {
            r: st.seq
            for r in g.ranks
            if r in summaries and (st := summaries[r].groups.get(g.name)) and st.seq is not None
        }
        if not gone or not seqs:
            continue
        top = max(seqs.values())
        waiting = [
            r
            for r, q in seqs.items()
            if q == top and _unfinished(summaries[r].groups.get(g.name), q)
        ]
        if waiting:
            found.append((g, top, gone, waiting))
    return found


def _chains_to_absent(
    culprits: list[int],
    stuck: list[Stuck],
    held: list[Held],
    groups: dict[str, Group],
    world: int,
) -> list[str]:
    """How each rank the record blames leads on to a rank with no readable dump, one line per
    rank; empty unless every one of them does.

    A blamed rank is silent: behind in a collective, waiting in none on the record. It leads on
    when it waits in a collective of a group holding an absent rank (`held`), or, waiting off
    the record (a pipeline's point-to-point receive, which gloo does not log), when it shares a
    group smaller than the world with an absent rank or with a rank that waits on one. A rank a
    mid-step rank waits for (one that waits while it holds up another group) stopped inside its
    own step: it is the end of its chain, absent neighbours or not."""
    waits_on_absent = {w: (g, seq, gone) for g, seq, gone, waiting in held for w in waiting}
    mid_step = ({w for s in stuck for w in s.waiting} | set(waits_on_absent)) & {
        b for s in stuck for b in s.behind
    }
    lines = []
    for rank in culprits:
        if rank in waits_on_absent:
            g, seq, gone = waits_on_absent[rank]
            lines.append(f"rank {rank} waits in collective seq {seq} of group {_name(g)} on {gone}")
            continue
        if any(rank in s.behind and set(s.waiting) & mid_step for s in stuck):
            return []
        step = _off_record_step(rank, groups, waits_on_absent, world)
        if step is None:
            return []
        lines.append(step)
    return lines


def _off_record_step(
    rank: int,
    groups: dict[str, Group],
    waits_on_absent: dict[int, tuple[Group, int, list[int]]],
    world: int,
) -> str | None:
    """The silent `rank`'s way on to an absent rank through a group it shares with one (or with
    a rank waiting on one), smallest group first; None if there is none."""
    absent = {a for _, _, gone in waits_on_absent.values() for a in gone}
    for g in sorted(groups.values(), key=lambda g: (len(g.ranks), _natural(g.name))):
        if rank not in g.ranks or len(g.ranks) >= world:
            continue
        others = [r for r in g.ranks if r != rank]
        if gone := sorted(set(others) & absent):
            return f"rank {rank} waits off the record in group {_name(g)} on {gone}"
        for w in others:
            if w in waits_on_absent:
                g2, seq, gone = waits_on_absent[w]
                return (
                    f"rank {rank} waits off the record in group {_name(g)} on rank {w}, which "
                    f"waits in collective seq {seq} of group {_name(g2)} on {gone}"
                )
    return None


def _name(g: Group) -> str:
    return f"{g.name} ({g.desc})"


def _blame_absence(
    report: Report,
    found: list[Held],
    summaries: dict[int, RankSummary],
    chains: list[str] | None = None,
) -> None:
    """The ranks present wait, directly or behind others, on ranks that left no readable dump:
    those are the likely culprits. Where they first held others up: a collective whose every
    missing member is absent (where a present member is behind too, as the victim of a subgroup
    hang is in the next world collective, that member waits elsewhere on them: a consequence),
    then the earliest issued (the two orders race), then the smallest group (as for a recorded
    hang). `chains` says how the ranks the record blamed lead on to them."""

    def issued(f: Held) -> int:
        times = [t for r in f[3] if (t := summaries[r].groups[f[0].name].created_ns.get(f[1]))]
        return min(times, default=2**63)

    def behind(f: Held) -> bool:
        return any(r in summaries and r not in f[3] for r in f[0].ranks)

    g, seq, gone, waiting = min(
        found, key=lambda f: (behind(f), issued(f), len(f[0].ranks), _natural(f[0].name))
    )
    op = _op_at(summaries, waiting, g.name, seq)
    report.verdict, report.evidence = "hang", "missing_dump"
    report.culprit_ranks = gone
    report.waiting_ranks = sorted(summaries)
    report.collective = {"pg": g.name, "pg_desc": g.desc, "seq": seq, "op": op}
    report.reason = (
        f"ranks {gone} left no readable dump while ranks {waiting} wait in collective seq {seq} "
        f"({op}) of group {g.name} ({g.desc}) that includes them: the verdict rests on the "
        "missing dumps (a rank that raised an error tears its process group down and often "
        "never dumps), not on a recorded collective"
    )
    if chains:
        report.reason += "; the ranks the record shows behind lead on to them: " + "; ".join(chains)


def _stuck_json(s: Stuck) -> dict[str, Any]:
    return {
        "pg": s.group.name,
        "pg_desc": s.group.desc,
        "pg_ranks": s.group.ranks,
        "seq": s.seq,
        "op": s.op,
        "waiting": s.waiting,
        "behind": s.behind,
    }


def _blame_mismatch(report: Report, m: dict[str, Any], groups: dict[str, Group]) -> None:
    report.verdict = "mismatch"
    report.culprit_ranks = m["culprit_ranks"]
    report.waiting_ranks = [r for r in groups[m["pg"]].ranks if r not in m["culprit_ranks"]]
    report.collective = {
        "pg": m["pg"],
        "pg_desc": m["pg_desc"],
        "seq": m["seq"],
        "op": m["expected"],
    }
    report.reason = (
        f"ranks {m['culprit_ranks']} issued a different collective at seq {m['seq']} of group "
        f"{m['pg']} ({m['pg_desc']}): expected {m['expected']}, got {m['ranks']}"
    )


def _blame_hang(report: Report, stuck: list[Stuck]) -> None:
    waiting = {r for s in stuck for r in s.waiting}
    behind = {r for s in stuck for r in s.behind}
    culprits = _roots(sorted(behind - waiting), stuck)
    if culprits:
        report.verdict = "hang"
        # Where the culprit held others up: a stuck collective it is missing from, first one
        # that no other rank is missing from (a rank also behind in a group is waiting on the
        # culprit elsewhere, and which of the two collectives was issued first is a race), then
        # the earliest issued, then the smallest group.
        where = min(
            (s for s in stuck if set(s.behind) & set(culprits)),
            key=lambda s: (
                not set(s.behind) <= set(culprits),
                s.issued_ns if s.issued_ns is not None else 2**63,
                len(s.group.ranks),
                _natural(s.group.name),
            ),
        )
        report.reason = (
            f"ranks {culprits} never issued collective seq {where.seq} ({where.op}) of group "
            f"{where.group.name} ({where.group.desc}) that ranks {where.waiting} wait in"
        )
    else:  # everybody waits on somebody: collectives issued in different orders
        report.verdict = "mismatch"
        culprits = sorted(behind)
        where = min(stuck, key=lambda s: (s.seq, _natural(s.group.name)))
        report.reason = (
            "cyclic wait: ranks are blocked in different groups' collectives, each waiting on "
            "the other (collectives issued in different orders)"
        )
    report.culprit_ranks = culprits
    report.waiting_ranks = sorted(waiting - set(culprits))
    report.collective = {
        "pg": where.group.name,
        "pg_desc": where.group.desc,
        "seq": where.seq,
        "op": where.op,
    }


def _roots(culprits: list[int], stuck: list[Stuck]) -> list[int]:
    """Of several silent ranks (behind, waiting in no recorded collective), the ones that stall
    a rank in the middle of its step: a rank that waits for them in one collective while it
    holds up another group itself. The others were held up too, in an operation the recorder
    does not log (a pipeline stage's point-to-point receive from the hung stage, with gloo), and
    are only late for the collective that ends the step, which finished ranks wait in."""
    if len(culprits) < 2:
        return culprits
    mid_step = {w for s in stuck for w in s.waiting} & {b for s in stuck for b in s.behind}
    roots = sorted(
        {c for s in stuck if set(s.waiting) & mid_step for c in s.behind} & set(culprits)
    )
    return roots or culprits


def _natural(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (2**63, name)
