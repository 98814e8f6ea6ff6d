"""A node's configuration fingerprint, and drift: the nodes whose fingerprint differs from the
fleet's majority, and in which fields.

A fingerprint is a flat map of named fields to strings. The node agent reports its node's from
NVML and the host (driver and CUDA versions, each GPU's VBIOS, InfoROM, persistence and ECC
modes, the kernel, and the node's NVLink domain, which is its identity and never drift) and from the job's runtime (`runtime_fields`: the Python, torch and NCCL
versions and the `NCCL_*` and `FI_*` environment the ranks are given); the burn-in's ranks
read the runtime fields in their own processes. `drift` is the one judgement both use
(`sentinel fleet drift`, and the burn-in before it measures anything).

`python -m sentinel.fingerprint` prints this process's runtime fields as JSON: the agent runs
it with the job's interpreter and environment (`agent.job_python`, `agent.job_env_file`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import platform
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sentinel.protocol import FINGERPRINT_FIELD, MAX_FINGERPRINT_FIELDS, MAX_FINGERPRINT_VALUE

# The environment a rank is given that changes how its collectives run.
ENV_PREFIXES = ("NCCL_", "FI_")
MISSING = "(missing)"
# Fields that name where a node is, not how it is set up: reported with the fingerprint, never
# judged as drift (each NVLink domain differs from the others by design).
IDENTITY = frozenset({"nvlink_domain"})
_FIELD = re.compile(FINGERPRINT_FIELD)

Fingerprint = Mapping[str, str]


def runtime_fields(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What this process runs a job with: kernel, Python, torch and NCCL versions (those it
    can import), and its `NCCL_*` / `FI_*` environment, each variable a field of its own."""
    env = os.environ if env is None else env
    fields = {"kernel": platform.release(), "python": platform.python_version()}
    try:
        import torch  # only where the job's torch is: its ranks, the agent's probe
    except ImportError:
        pass
    else:
        fields["torch"] = torch.__version__
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        if nccl is not None:
            fields["nccl"] = ".".join(str(n) for n in nccl)
    for name in sorted(env):
        if name.startswith(ENV_PREFIXES):
            fields[f"env.{name}"] = env[name]
    return checked(fields)


def checked(fields: Mapping[str, str]) -> dict[str, str]:
    """Fields kept within the protocol's bounds: names of the allowed characters, values cut
    to their longest, as many fields as a fingerprint holds (in name order)."""
    kept = {k: str(v)[:MAX_FINGERPRINT_VALUE] for k, v in sorted(fields.items()) if _FIELD.match(k)}
    return dict(list(kept.items())[:MAX_FINGERPRINT_FIELDS])


def node_fields(ranks: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """One node's fingerprint from its ranks' runtime fields, in local-rank order: a field every
    rank holds alike is the node's; one that differs between them is kept per rank as
    `local.I.FIELD`. A site that binds each rank to its own adapter (NCCL_IB_HCA by local
    rank) has the same per-rank fields on every node, so nothing differs; a node where one
    rank was given something else has fields the others lack, and is named for them."""
    names = sorted({k for fields in ranks for k in fields})
    out: dict[str, str] = {}
    for name in names:
        values = [fields.get(name, MISSING) for fields in ranks]
        if len(set(values)) == 1:
            out[name] = values[0]
        else:
            out |= {f"local.{i}.{name}": v for i, v in enumerate(values)}
    return checked(out)


@dataclass(frozen=True)
class Difference:
    field: str
    value: str  # this node's (MISSING when it does not report the field)
    majority: str  # the fleet's (MISSING when most nodes do not report it); "" when split


@dataclass(frozen=True)
class Drifted:
    node: str
    differences: tuple[Difference, ...]

    def reason(self) -> str:
        """One line: what differs, for an exclude list or an incident."""
        said = [
            f"{d.field}={d.value} (fleet: {d.majority or 'no majority'})" for d in self.differences
        ]
        return "configuration drift: " + ", ".join(said)


def allowed(field: str, patterns: Iterable[str]) -> bool:
    """A field declared allowed to vary (`fnmatch` patterns: `env.NCCL_DEBUG`, `gpu.*.inforom`)."""
    return any(fnmatch.fnmatchcase(field, p) for p in patterns)


def drift(prints: Mapping[str, Fingerprint], allow: Iterable[str] = ()) -> list[Drifted]:
    """The nodes whose fingerprint differs from the fleet's majority, in node order.

    Field by field over every node: the value most nodes hold is the fleet's (a node without
    the field holds MISSING). A node holding another is named with that field. A field whose
    most common value is shared by no more than half the nodes has no majority: every node is
    named with it, since nothing says which side is right. With fewer than three nodes there
    is no majority to speak of: nothing is named."""
    patterns = tuple(allow)
    nodes = sorted(prints)
    if len(nodes) < 3:
        return []
    fields = sorted(
        {f for fp in prints.values() for f in fp if f not in IDENTITY and not allowed(f, patterns)}
    )
    found: dict[str, list[Difference]] = {}
    for field in fields:
        values = {n: prints[n].get(field, MISSING) for n in nodes}
        (top, count), *rest = Counter(values.values()).most_common()
        if not rest:
            continue
        majority = top if 2 * count > len(nodes) else ""
        for node, value in values.items():
            if value != majority:
                found.setdefault(node, []).append(Difference(field, value, majority))
    return [Drifted(n, tuple(found[n])) for n in nodes if n in found]


def main() -> int:
    print(json.dumps(runtime_fields(), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
