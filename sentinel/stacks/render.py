"""Grouped stacks as text, for a person: one block per group, the odd ones out first, each
thread as Python prints a traceback (most recent call last)."""

from __future__ import annotations

from typing import Any

from sentinel.stacks.group import rank_ranges


def render(doc: dict[str, Any]) -> str:
    """`doc`: what `GET /v1/jobs/{job}/stacks/{request}` answers (`Grouped.as_json()` plus the
    job, the request and the seconds it took)."""
    world, answered = doc["world_size"], doc["answered"]
    groups = doc["groups"]
    lines = [
        f"job {doc.get('job', '?')}, request {doc.get('request', '?')}: {answered} of {world}"
        f" rank(s) answered in {doc.get('elapsed_s', 0.0):.1f} s; {len(groups)} distinct stack(s)"
    ]
    if doc["missing_ranks"]:
        lines.append(
            f"NO ANSWER from ranks {rank_ranges(doc['missing_ranks'])}: gone, stopped, or stuck"
            " in a C call that holds the GIL (a rank waiting in a collective still answers)"
        )
    for g in groups:
        n = len(g["ranks"])
        lines += ["", f"=== ranks {g['ranks_text']} ({n} of {world}) ==="]
        for t in g["threads"]:
            lines += _thread(t)
    return "\n".join(lines) + "\n"


def _thread(t: dict[str, Any]) -> list[str]:
    daemon = " (daemon)" if t.get("daemon") else ""
    out = [f'Thread "{t["name"]}"{daemon}, most recent call last:']
    if t.get("frames_left_out"):
        out.append(f"  ... {t['frames_left_out']} outer frame(s) left out")
    for f in t["frames"]:
        out.append(f'  File "{f["file"]}", line {f["line"]}, in {f["func"]}')
        if f.get("code"):
            out.append(f"    {f['code']}")
    return out
