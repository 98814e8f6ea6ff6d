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
    held = _waiting_on_absent(groups, summaries, absent) if absent else []
    report.mismatches = mismatches
    report.stuck_groups = [_stuck_json(s) for s in stuck]
    if mismatches:
        _blame_mismatch(report, mismatches[0], groups)
    elif stuck or held:
        walk = WaitWalk(recorded_waits(stuck, held, summaries), groups, summaries, world)
        culprits = walk.culprits()
        if set(culprits) & set(absent):
            _blame_absence(report, culprits, held, stuck, walk, summaries)
            return report
        if culprits:
            _blame_hang(report, culprits, stuck, walk)
        else:
            _blame_cycle(report, stuck)
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
    wait (issued it and did not see it complete; where the dump records no completions, as
    gloo's, it is the last collective the rank issued, since a blocked rank issues no more)."""
    last_issued = {r: _last_issued_ns(s) for r, s in summaries.items()}
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
            if q == top and _blocked_in(summaries[r].groups[g.name], q, last_issued[r])
        ]
        if waiting:
            found.append((g, top, gone, waiting))
    return found


def _last_issued_ns(summary: RankSummary) -> int | None:
    times = [t for st in summary.groups.values() if st.seq is not None and (t := _issued(st))]
    return max(times, default=None)


def _issued(state: GroupState) -> int | None:
    return state.created_ns.get(state.seq) if state.seq is not None else None


def _blocked_in(state: GroupState, seq: int, last_issued_ns: int | None) -> bool:
    if not _unfinished(state, seq):
        return False
    if state.completed is not None or last_issued_ns is None or _issued(state) is None:
        return True
    return _issued(state) == last_issued_ns


@dataclass(eq=False)
class Wait:
    """How a rank waits on others: in a recorded collective of a group (`seq`), or off the
    record (`seq` None: a pipeline's point-to-point receive, which gloo does not log) on members
    of a group it shares with them. One object is shared by every rank waiting the same way."""

    group: Group
    seq: int | None
    on: tuple[int, ...]
    op: str | None = None

    def describe(self, next_rank: int) -> str:
        more = f" (and {len(self.on) - 1} more)" if len(self.on) > 1 else ""
        if self.seq is None:
            return f"waits off the record in group {_name(self.group)} on rank {next_rank}{more}"
        return (
            f"waits in collective seq {self.seq} ({self.op}) of group {_name(self.group)} on "
            f"rank {next_rank}{more}"
        )


def recorded_waits(
    stuck: list[Stuck], held: list[Held], summaries: dict[int, RankSummary]
) -> dict[int, list[Wait]]:
    """What each rank waits on by the record: the members behind it in a stuck collective or,
    where it is behind no present member, the absent members of a group whose collective it
    waits in (whether they issued it, nobody can tell: a present member behind is a surer
    cause)."""
    waits: dict[int, list[Wait]] = {}
    for s in stuck:
        wait = Wait(s.group, s.seq, tuple(s.behind), s.op)
        for r in s.waiting:
            waits.setdefault(r, []).append(wait)
    on_present = set(waits)
    for g, seq, gone, waiting in held:
        wait = Wait(g, seq, tuple(gone), _op_at(summaries, waiting, g.name, seq))
        for r in waiting:
            if r not in on_present:
                waits.setdefault(r, []).append(wait)
    return waits


class WaitWalk:
    """The wait-for graph walked from every waiting rank, through every group, to its ends: ranks
    that wait on nobody (a rank with no dump says nothing, so it ends its chain too).

    A present rank that waits in no recorded collective may wait off the record: gloo does not
    log a pipeline's point-to-point receives. It is taken to wait on the members of a group it
    shares (short of the world, smallest first) that lead on to a rank that left no dump: absent
    members first, then members that wait on the record, then members that wait off it in turn.
    With every dump there, a silent rank that others wait on is the end of its chain. A rank
    that a mid-step rank (one that waits while others wait on it) waits for stopped inside its
    own step: it goes on only to absent members of its groups (a pipeline stage that died
    mid-step), else it ends its chain. A wait back into the chain walked so far leads nowhere
    (cycle protection); when every recorded wait does, the ranks wait on each other: collectives
    issued in different orders."""

    def __init__(
        self,
        waits: dict[int, list[Wait]],
        groups: dict[str, Group],
        summaries: dict[int, RankSummary],
        world: int,
    ) -> None:
        self.waits = waits
        self.present = summaries.keys()
        self.via: dict[int, list[Wait]] = {}  # the waits each rank's chain goes on through
        self._ends: dict[int, frozenset[int]] = {}
        self._wait_ends: dict[int, frozenset[int]] = {}  # by id() of a shared Wait
        self._walking: set[int] = set()
        self._small: dict[int, list[Group]] = {}
        small = [g for g in groups.values() if len(g.ranks) < world]
        for g in sorted(small, key=lambda g: (len(g.ranks), _natural(g.name))):
            for r in g.ranks:
                self._small.setdefault(r, []).append(g)
        unique = {id(w): w for ws in waits.values() for w in ws}.values()
        waited_on = {r for w in unique for r in w.on}
        mid_step = waited_on & waits.keys()
        self.stalls_mid_step = {r for m in mid_step for w in waits[m] for r in w.on}

    def culprits(self) -> list[int]:
        """The ends of every chain; of several, the ones that stall a mid-step rank (the others
        were held up off the record, and are only late for the collective that ends the step).
        Empty: every chain runs in a circle."""
        ends = frozenset().union(*(self.ends(r) for r in sorted(self.waits)))
        return sorted(ends & self.stalls_mid_step or ends)

    def ends(self, rank: int) -> frozenset[int]:
        if rank in self._ends:
            return self._ends[rank]
        if rank not in self.present:
            return frozenset([rank])
        if rank in self._walking:
            return frozenset()  # back into the chain being walked
        self._walking.add(rank)
        try:
            found = self._recorded_ends(rank) if rank in self.waits else self._off_record(rank)
        finally:
            self._walking.discard(rank)
        self._ends[rank] = found
        return found

    def _recorded_ends(self, rank: int) -> frozenset[int]:
        self.via[rank] = self.waits[rank]
        return frozenset().union(*(self._through(w) for w in self.waits[rank]))

    def _through(self, wait: Wait) -> frozenset[int]:
        key = id(wait)
        if key not in self._wait_ends:
            found = frozenset().union(*(self.ends(r) for r in wait.on))
            if not found:
                return found  # a cycle, as seen from here: another start may see further
            self._wait_ends[key] = found
        return self._wait_ends[key]

    def _off_record(self, rank: int) -> frozenset[int]:
        # Stalling a mid-step rank, it stopped inside its own step: not on a present rank's
        # account (that one would be waiting in a recorded collective), but a pipeline receive
        # from a stage that died (no dump) stops a rank there just the same.
        tiers = 1 if rank in self.stalls_mid_step else 3
        for tier in range(tiers):
            for g in self._small.get(rank, []):
                on = self._off_record_tiers(rank, g)[tier]
                found = frozenset().union(*(self.ends(r) for r in on)) - {rank}
                # Off the record, only a way on to a rank that left no dump is taken: a guess
                # at a receive is surer than the silence of a rank the record shows behind
                # only where the record cannot speak. With every dump there, the silent rank
                # others wait on is the end (a rank hung in its step is silent too).
                if found - self.present:
                    self.via[rank] = [Wait(g, None, tuple(on))]
                    return found
        return frozenset([rank])

    def _off_record_tiers(self, rank: int, g: Group) -> list[list[int]]:
        """Members of `g` `rank` may wait on off the record, surest first."""
        others = [r for r in g.ranks if r != rank]
        waiting = [r for r in others if r in self.waits and not self._waits_on(r, rank)]
        silent = [r for r in others if r in self.present and r not in self.waits]
        return [[r for r in others if r not in self.present], waiting, silent]

    def _waits_on(self, waiter: int, rank: int) -> bool:
        return any(rank in w.on for w in self.waits[waiter])

    def chains(self, culprits: list[int], limit: int = 3) -> list[str]:
        """The longest chains of waits that end at `culprits`, at most `limit`, each as
        'rank a waits ... on rank b, which waits ... on rank c'; a chain that joins one already
        told stops there."""
        ends = set(culprits)
        hops = {r: hop for r in self.via if (hop := self._hop_toward(r, ends))}
        nexts = {t for _, t in hops.values()}
        depth: dict[int, int] = {}
        for r in hops:
            depth[r] = self._depth(r, hops, depth)
        starts = sorted((r for r in hops if r not in nexts), key=lambda r: (-depth[r], r))
        told: set[int] = set()
        lines = []
        for start in starts[:limit]:
            lines.append(f"rank {start} " + ", which ".join(self._told(start, hops, told)))
        return lines

    def _hop_toward(self, rank: int, ends: set[int]) -> tuple[Wait, int] | None:
        for w in self.via[rank]:
            for t in w.on:
                if t in ends or self.ends(t) & ends:
                    return w, t
        return None

    @staticmethod
    def _depth(rank: int, hops: dict[int, tuple[Wait, int]], depth: dict[int, int]) -> int:
        path: list[int] = []
        r: int | None = rank
        while r is not None and r in hops and r not in depth and r not in path:
            path.append(r)
            r = hops[r][1]
        base = depth.get(r, 0) if r is not None else 0
        for i, p in enumerate(reversed(path)):
            depth[p] = base + i + 1
        return depth[rank]

    @staticmethod
    def _told(start: int, hops: dict[int, tuple[Wait, int]], told: set[int]) -> list[str]:
        parts = []
        r = start
        while r in hops and r not in told:
            told.add(r)
            wait, r = hops[r]
            parts.append(wait.describe(r) + (" (as above)" if r in told else ""))
        return parts

    def last_present(self, culprits: list[int]) -> set[int]:
        """The ranks present whose own wait is on a culprit: where the chains reach them."""
        ends = set(culprits)
        return {r for r, ws in self.via.items() if any(set(w.on) & ends for w in ws)}


def _name(g: Group) -> str:
    return f"{g.name} ({g.desc})"


def _chain_reason(walk: WaitWalk, culprits: list[int]) -> str:
    chains = walk.chains(culprits)
    return "; the chains of waits: " + "; ".join(chains) if chains else ""


def _blame_absence(
    report: Report,
    culprits: list[int],
    held: list[Held],
    stuck: list[Stuck],
    walk: WaitWalk,
    summaries: dict[int, RankSummary],
) -> None:
    """The chains of waits end at ranks that left no readable dump: those are the likely
    culprits. Where they first held others up: a collective waiting on them whose every missing
    member is absent (where a present member is behind too, as the victim of a subgroup hang is
    in the next world collective, that member waits elsewhere on them: a consequence), then the
    earliest issued (the two orders race), then the smallest group (as for a recorded hang).
    When the chains reach them only off the record, where the last ranks present are behind."""

    def issued(f: Held) -> int:
        times = [t for r in f[3] if (t := summaries[r].groups[f[0].name].created_ns.get(f[1]))]
        return min(times, default=2**63)

    def behind(f: Held) -> bool:
        return any(r in summaries and r not in f[3] for r in f[0].ranks)

    report.verdict, report.evidence = "hang", "missing_dump"
    report.culprit_ranks = culprits
    report.waiting_ranks = sorted(summaries)
    rests = (
        "the verdict rests on the missing dumps (a rank that raised an error tears its process "
        "group down and often never dumps), not on a recorded collective"
    )
    found = [f for f in held if set(f[2]) & set(culprits)]
    if found:
        g, seq, _, waiting = min(
            found, key=lambda f: (behind(f), issued(f), len(f[0].ranks), _natural(f[0].name))
        )
        op = _op_at(summaries, waiting, g.name, seq)
        report.collective = {"pg": g.name, "pg_desc": g.desc, "seq": seq, "op": op}
        report.reason = (
            f"ranks {culprits} left no readable dump while ranks {waiting} wait in collective "
            f"seq {seq} ({op}) of group {_name(g)} that includes them: {rests}"
        )
    else:
        last = sorted(walk.last_present(culprits))
        where = _where_held_up(stuck, last)
        report.collective = _collective(where) if where is not None else None
        report.reason = (
            f"ranks {culprits} left no readable dump, and ranks {last} wait on them off the "
            f"record: {rests}"
        )
    report.reason += _chain_reason(walk, culprits)


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


def _collective(s: Stuck) -> dict[str, Any]:
    return {"pg": s.group.name, "pg_desc": s.group.desc, "seq": s.seq, "op": s.op}


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


def _where_held_up(stuck: list[Stuck], ranks: list[int]) -> Stuck | None:
    """Where `ranks` held others up: a stuck collective they are missing from, first one that
    no other rank is missing from (a rank also behind in a group is waiting on them elsewhere,
    and which of the two collectives was issued first is a race), then the earliest issued,
    then the smallest group."""
    return min(
        (s for s in stuck if set(s.behind) & set(ranks)),
        key=lambda s: (
            not set(s.behind) <= set(ranks),
            s.issued_ns if s.issued_ns is not None else 2**63,
            len(s.group.ranks),
            _natural(s.group.name),
        ),
        default=None,
    )


def _blame_hang(report: Report, culprits: list[int], stuck: list[Stuck], walk: WaitWalk) -> None:
    """The chains of waits end at ranks present that wait on nobody: they stopped."""
    where = _where_held_up(stuck, culprits) or min(stuck, key=lambda s: s.seq)
    report.verdict = "hang"
    report.reason = (
        f"ranks {culprits} never issued collective seq {where.seq} ({where.op}) of group "
        f"{_name(where.group)} that ranks {where.waiting} wait in"
    ) + _chain_reason(walk, culprits)
    report.culprit_ranks = culprits
    report.waiting_ranks = sorted({r for s in stuck for r in s.waiting} - set(culprits))
    report.collective = _collective(where)


def _blame_cycle(report: Report, stuck: list[Stuck]) -> None:
    """Everybody waits on somebody: collectives issued in different orders."""
    where = min(stuck, key=lambda s: (s.seq, _natural(s.group.name)))
    report.verdict = "mismatch"
    report.culprit_ranks = sorted({r for s in stuck for r in s.behind})
    report.waiting_ranks = sorted({r for s in stuck for r in s.waiting} - set(report.culprit_ranks))
    report.collective = _collective(where)
    report.reason = (
        "cyclic wait: ranks are blocked in different groups' collectives, each waiting on "
        "the other (collectives issued in different orders)"
    )


def _natural(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (2**63, name)
