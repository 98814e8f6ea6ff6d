"""Configuration: strict pydantic models, read once at the edge from YAML or TOML plus environment.

Unknown keys are errors (a typo must not silently fall back to a default). Environment variables
override the file: `SENTINEL_<SECTION>__<FIELD>[__<SUBFIELD>]`, e.g.
`SENTINEL_AGENT__INTERVAL_S=2`. Everything has a default, so no file is needed to start.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sentinel.exitcodes import InputError
from sentinel.faults.blame import LemonPolicy
from sentinel.faults.catalog import RULE_BY_NAME
from sentinel.inputs import parse_yaml, read_text
from sentinel.protocol import Recovery

ENV_PREFIX = "SENTINEL_"


# One coordinator URL, or several (replicas sharing one store) as a list or comma-separated:
# the client fails over between them in order (sentinel/failover.py).
def parse_urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """One URL, a comma-separated list, or a sequence of them; each http(s)://host[:port][/path]
    with no credentials in it. Raises ValueError saying what is wrong."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list | tuple) and all(isinstance(u, str) for u in value):
        items = list(value)
    else:
        raise ValueError("give a coordinator URL, or a list of them")
    urls = [u.strip().rstrip("/") for u in items if u.strip()]
    if not urls:
        raise ValueError("no coordinator URL given")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s)://HOST[:PORT] coordinator URL")
        if parts.username or parts.password:
            # The URL is not repeated: its password would reach the terminal or a log.
            raise ValueError("a coordinator URL carries no user or password (use a token file)")
        if parts.query or parts.fragment:
            raise ValueError(f"a coordinator URL has no query or fragment: {url}")
    if len(set(urls)) != len(urls):
        raise ValueError(f"a coordinator URL is listed twice: {', '.join(urls)}")
    return tuple(urls)


CoordinatorUrls = Annotated[tuple[str, ...], BeforeValidator(parse_urls)]


def host_port(listen: str) -> tuple[str, int]:
    """A daemon's listen address, HOST:PORT (an IPv6 host in brackets; no host: every
    interface), as (host, port). Raises ValueError saying what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{listen!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"{listen!r}: port {port} is out of range (0-65535)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _listen(value: str) -> str:
    host_port(value)
    return value


Listen = Annotated[str, AfterValidator(_listen)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogConfig(StrictModel):
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


class HealthThresholds(StrictModel):
    """Limits the health rules judge readings against (sentinel.agent.health.judge)."""

    gpu_temp_degraded_c: float = 85.0
    gpu_temp_unhealthy_c: float = 92.0
    mem_temp_degraded_c: float = 95.0
    mem_temp_unhealthy_c: float = 105.0
    # NVIDIA retires at most 64 pages per GPU on A100-class parts; drain well before that.
    retired_pages_unhealthy: int = 48
    dbe_aggregate_degraded: int = Field(default=1, ge=1)
    remapped_rows_uncorrectable_degraded: int = Field(default=1, ge=1)
    # Temperatures clear this far below the limit that raised them (hysteresis).
    temp_hysteresis_c: float = Field(default=3.0, ge=0)
    # Error counters are judged as increases per minute over this window (see agent/health/rates.py).
    rate_window_s: float = Field(default=300.0, gt=0)
    # DCGM's PCIe replay-rate limit is 8 per minute.
    pcie_replay_rate_degraded: float = Field(default=8.0, gt=0)
    nvlink_error_rate_degraded: float = Field(default=60.0, gt=0)
    sbe_rate_degraded: float = Field(default=100.0, gt=0)
    # Peer outliers: robust z-score against the node's GPUs, this many polls in a row.
    outlier_z: float = Field(default=4.0, gt=0)
    outlier_polls: int = Field(default=2, ge=1)
    xid_window_s: float = 3600.0
    xid_escalate_after: int = Field(default=3, ge=2)
    # Hold-downs by rule name, overriding the catalog's (sentinel/faults/catalog.py).
    hold_s: dict[str, float] = Field(default_factory=dict)

    @field_validator("hold_s")
    @classmethod
    def _known_rules(cls, holds: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(holds) - set(RULE_BY_NAME))
        if unknown:
            raise ValueError(f"unknown rule(s) {unknown}; known: {sorted(RULE_BY_NAME)}")
        if any(v < 0 for v in holds.values()):
            raise ValueError("a hold is a number of seconds >= 0")
        return holds


class NodeValidationConfig(StrictModel):
    """Where the agent runs the validation burn-in a node's return asks for
    (agent/uplink/validation.py; docs/deploy.md)."""

    # "process": a child of the agent, under the agent's own limits (a development node, the
    # simulated fleet). "systemd": the shipped template unit sentinel-validate@.service, with
    # the node's limits and its GPU devices. "slurm": a job step on this node, inside the
    # maintenance reservation the coordinator's Slurm backend holds the node in.
    launcher: Literal["process", "systemd", "slurm"] = "process"
    # The interpreter with Sentinel's torch extra ("process", "slurm"); None: job_python,
    # else the agent's own. The systemd unit names its own.
    python: str | None = Field(default=None, min_length=1)
    # Where each request's files are written (baseline in, verdict out). None: the system's
    # temporary directory, which a job or unit outside the agent's sandbox cannot see.
    workdir: Path | None = None
    srun: str = Field(default="srun", min_length=1)
    systemctl: str = Field(default="systemctl", min_length=1)

    @model_validator(mode="after")
    def _a_job_sees_the_files(self) -> NodeValidationConfig:
        if self.launcher != "process" and self.workdir is None:
            raise ValueError(
                f"the {self.launcher} launcher runs the burn-in outside the agent's private"
                " /tmp: set workdir to a directory the agent writes (the shipped unit:"
                " /var/lib/sentinel/validate)"
            )
        return self


class SimConfig(StrictModel):
    gpus: int = Field(default=8, ge=1, le=64)
    model: str = "NVIDIA H100 80GB HBM3"
    seed: int = 0


DcgmNaming = Literal["legacy", "dcgm-4.7", "both"]
# A configuration fingerprint field, or an fnmatch pattern of them (sentinel/fingerprint.py).
DRIFT_PATTERN = r"^[A-Za-z0-9_.:*?\[\]-]{1,128}$"
DriftPattern = Annotated[str, Field(pattern=DRIFT_PATTERN)]


class AgentConfig(StrictModel):
    node_id: str = Field(default_factory=socket.gethostname, min_length=1)
    listen: Listen = "127.0.0.1:9410"
    interval_s: float = Field(default=1.0, gt=0)
    # None: no coordinator (the agent serves /metrics only).
    coordinator_url: CoordinatorUrls | None = None
    token_file: Path | None = None
    spool_dir: Path = Path("/var/lib/sentinel/spool")
    spool_max_events: int = Field(default=100_000, ge=1)
    batch_max_events: int = Field(default=500, ge=1)
    rank_socket: Path | None = Path("/run/sentinel/agent.sock")
    # The hang watchdog from outside the ranks (agent/ranks/watch.py): a registered rank whose
    # beacon shows no progress for its own hang timeout plus this long, and whose own watchdog
    # has not said so, is reported hung by the agent. The rank's watchdog thread wakes at its
    # deadline and marks the beacon at once; a second is its room to on a busy host, and a
    # late one costs nothing: the hang playbook takes the agent's word for the culprit only
    # for a rank stopped or spinning, never for one asleep.
    outside_hang_margin_s: float = Field(default=1.0, ge=0, le=300)
    # Where this node's ranks dump flight recorders (node-local): carried to the coordinator
    # after an fr.dump command, for the job's analysis. None: not carried.
    fr_dir: Path | None = None
    heartbeat_s: float = Field(default=15.0, gt=0)
    sim: SimConfig | None = None
    thresholds: HealthThresholds = HealthThresholds()
    # A call into NVML older than this makes the node unhealthy (rule nvml_unresponsive).
    nvml_call_deadline_s: float = Field(default=5.0, gt=0)
    # Between sweeps, this often: a cheap look at XID events, double-bit ECC counts and
    # temperatures; one that moved triggers a sweep at once (a hardware fault is judged within
    # a fraction of the interval).
    urgent_poll_s: float = Field(default=0.25, gt=0)
    # Host statistics (CPU, memory, disk, network) are exported, never judged, and change
    # slowly: read this often rather than every sweep, where they cost a third of the sweep.
    host_interval_s: float = Field(default=5.0, gt=0)
    # NVML readings costly to the driver (total energy ~3 ms a read on an H200, PCIe replays
    # ~0.2 ms; sentinel/agent/nvml/scalars.py): counters judged as rates, read this often.
    costly_reads_interval_s: float = Field(default=10.0, ge=0)
    # GPUs this node should have; None: count NVIDIA display devices under pci_devices_dir.
    expected_gpus: int | None = Field(default=None, ge=0)
    pci_devices_dir: Path = Path("/sys/bus/pci/devices")
    # The kernel log: "auto" (/dev/kmsg when reading real GPUs, off for simulated ones), "off",
    # or a path (a file or FIFO of kmsg records works too: tests).
    kmsg: str = Field(default="auto", min_length=1)
    # Filesystems whose read-only remount is a finding, besides the root.
    checkpoint_dirs: list[Path] = Field(default_factory=list)
    mounts_file: Path = Path("/proc/self/mounts")
    # The dcgm-exporter-compatible series' naming: "legacy" (dcgm-exporter up to 4.8: MHz, %,
    # MiB, mJ, a `Hostname` label), "dcgm-4.7" (dcgm-exporter 4.9: DCGM's canonical names in
    # base units, a `hostname` label) or "both" while dashboards move over.
    dcgm_names: DcgmNaming = "legacy"
    # The node's configuration fingerprint (docs/agent.md) is sent at start, when it changes
    # and this often: keep it well under the coordinator's `event_retention_s` (a week), which
    # prunes a node's last one otherwise.
    fingerprint_every_s: float = Field(default=3600.0, gt=0)
    # The interpreter the node's ranks run: the agent runs `JOB_PYTHON -m sentinel.fingerprint`
    # (no shell, 30 s at most) for their Python, torch and NCCL versions. None: no probe, the
    # fingerprint's runtime is the kernel alone.
    job_python: str | None = Field(default=None, min_length=1)
    # The environment the site gives its ranks (KEY=VALUE lines, as systemd's EnvironmentFile=),
    # added to the probe's so that its NCCL_* and FI_* fields are the ranks'. Its values are
    # never logged.
    job_env_file: Path | None = None
    validation: NodeValidationConfig = NodeValidationConfig()

    @model_validator(mode="after")
    def _env_file_needs_the_probe(self) -> AgentConfig:
        if self.job_env_file is not None and self.job_python is None:
            raise ValueError(
                "job_env_file is read by the job's interpreter (job_python): set job_python too"
            )
        return self

    @model_validator(mode="after")
    def _costly_reads_fit_the_rate_window(self) -> AgentConfig:
        # PCIe replays are judged as a rate over the window: read at least twice in it.
        window = self.thresholds.rate_window_s
        if self.costly_reads_interval_s > window / 2:
            raise ValueError(
                f"costly_reads_interval_s ({self.costly_reads_interval_s:g}) must be at most half"
                f" of thresholds.rate_window_s ({window:g}): the PCIe replay rate is judged"
                " over that window"
            )
        return self


class EvictionBudgetConfig(StrictModel):
    """At most `max_per_window` nodes evicted per `window_s`, and at most `max_percent` of the
    fleet (its nodes in service and out of it; spares do not count) when set, the smaller of
    the two; never below `min_fleet` nodes."""

    max_per_window: int = Field(default=2, ge=0)
    max_percent: float | None = Field(default=None, gt=0, le=100)
    window_s: float = Field(default=3600.0, gt=0)
    min_fleet: int = Field(default=1, ge=0)


class ValidationConfig(StrictModel):
    """The gate before an evicted node returns (coordinator/validation.py): its agent healthy
    for `hold_down_s`, then the validation burn-in on the node against `baseline` (a file of
    `sentinel burnin --validate --save-baseline`). No baseline: no node returns."""

    baseline: Path | None = None
    hold_down_s: float = Field(default=300.0, ge=0)
    # The agent heard from no longer than this ago (its heartbeat is every 15 s): silent past
    # it, the node is not healthy, and the hold-down starts again when it speaks.
    stale_s: float = Field(default=45.0, gt=0)
    # The agent's answer, from the command's queueing; and the hold-down, from the return's
    # start, may take this long past `hold_down_s`. Then the return escalates.
    timeout_s: float = Field(default=900.0, gt=0)


class CoordinatorConfig(StrictModel):
    listen: Listen = "127.0.0.1:8470"
    # A second port that serves only `POST /v1/events`, past aiohttp (coordinator/front.py):
    # what a large fleet's agents post to. None: events go to the API port only.
    ingest_listen: Listen | None = None
    state_dir: Path = Path("/var/lib/sentinel/coordinator")
    # None: SQLite in state_dir (one coordinator). A PostgreSQL URL
    # (postgresql://USER@HOST:PORT/DB?sslmode=verify-full): several replicas share it, one
    # leads. No password in the URL: libpq reads PGPASSFILE / PGPASSWORD, or name a file here.
    store: str | None = None
    store_password_file: Path | None = None
    # The leader's lease: renewed every third of it; a follower takes over once it ran out.
    lease_ttl_s: float = Field(default=5.0, ge=1.0, le=60.0)
    # None: this coordinator's playbooks shipped with Sentinel (playbooks/ of the installation).
    playbooks_dir: Path | None = None
    # The rules corpus's scores a playbook that evicts or stops must clear to act
    # (`sentinel rules score --json FILE`); None: the shipped corpus/precision.json.
    precision_file: Path | None = None
    eviction_backend: Literal["exclude_file", "slurm", "kubernetes"] = "exclude_file"
    exclude_file: Path | None = None  # default: <state_dir>/exclude.txt
    scontrol: str = "scontrol"
    # One `scontrol update`, controller down included (scontrol retries MessageTimeout).
    scontrol_timeout_s: float = Field(default=30.0, gt=0)
    # Slurm runs no job on a drained node: a node being returned is validated inside a
    # maintenance reservation (`sentinel-validate-NODE`) that admits this user alone, the one
    # the nodes' agents run as (they launch the validation as a job step there).
    slurm_validation_user: str = Field(default="sentinel", pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")
    # The scheduler bridge (coordinator/core/scheduler.py): how often the leader reads every
    # node's state where the scheduler looks (Slurm: `scontrol show node`), to see drains by
    # others and nodes resumed without validation. 0: never. Backends that cannot tell (the
    # exclude file, Kubernetes) are not polled.
    scheduler_poll_s: float = Field(default=10.0, ge=0)
    kubernetes_api: str = "https://kubernetes.default.svc"
    kubernetes_token_file: Path | None = None
    kubernetes_taint_key: str = "sentinel.dev/evicted"
    eviction: EvictionBudgetConfig = EvictionBudgetConfig()
    # A job restarted this many times for one cause with no checkpoint committed since is
    # stopped and its incident escalated (a playbook's `resume` step may set its own `budget`).
    restart_budget: int = Field(default=3, ge=1)
    # A node whose weighted blame (sentinel.faults.blame) reaches `threshold` within `window_s`
    # is not returned to service until a person clears it.
    lemon: LemonPolicy = LemonPolicy()
    validation: ValidationConfig = ValidationConfig()
    dry_run: bool = False
    default_cooldown_s: float = Field(default=300.0, ge=0)
    job_heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    long_poll_max_s: float = Field(default=30.0, gt=0)
    engine_tick_s: float = Field(default=0.2, gt=0)
    # Group commit: a batch waits at most this long for others to share its commit. Each
    # commit costs ~0.2 ms of CPU whatever it holds; batches spread over the second (a paced
    # fleet) would otherwise commit one or two at a time.
    commit_window_s: float = Field(default=0.005, ge=0, le=1.0)
    # Events no incident holds are deleted this long after they arrived (a week). A replay
    # older than this is stored again, and no trigger window may be longer.
    event_retention_s: float = Field(default=7 * 86400.0, gt=0)
    # Fingerprint fields allowed to differ between nodes (`sentinel fleet drift`): fnmatch
    # patterns such as "env.NCCL_DEBUG" or "gpu.*.inforom".
    drift_allowed: list[DriftPattern] = Field(default_factory=list, max_length=256)
    step_timeout_s: float = Field(default=600.0, gt=0)
    # An outside effect (a drain through scontrol or the Kubernetes API, a notification) that
    # has not answered in this long is recorded as failed (a drain's or a return's step
    # escalates: a person looks).
    effect_timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("store")
    @classmethod
    def _store_url(cls, url: str | None) -> str | None:
        """A PostgreSQL URL without a password. The message never repeats the URL: it may
        hold the very secret it refuses."""
        if url is None:
            return None
        scheme, sep, rest = url.partition("://")
        if scheme not in ("postgresql", "postgres") or not sep:
            raise ValueError("must be a postgresql:// URL (leave it unset for SQLite)")
        if ":" in rest.split("@", 1)[0] and "@" in rest:
            raise ValueError(
                "must not carry a password: use store_password_file, PGPASSFILE or PGPASSWORD"
            )
        return url


class SupervisorConfig(StrictModel):
    """`sentinel run`: where the coordinator is and what gang to launch."""

    coordinator_url: CoordinatorUrls = ("http://127.0.0.1:8470",)
    token_file: Path | None = None
    job_id: str = Field(default="job", min_length=1, pattern=r"^[A-Za-z0-9_.:@-]+$")
    # local: ranks as local processes (the simulated fleet); slurm: a job step per generation
    # inside the Slurm allocation `sentinel run` runs in (or asks for with salloc).
    launcher: Literal["local", "slurm"] = "local"
    nodes: int = Field(default=2, ge=1)
    gpus_per_node: int = Field(default=2, ge=1)
    spares: int = Field(default=1, ge=0)
    master_addr: str = "127.0.0.1"
    # Unset: the local launcher picks a free port for each generation (a fixed one collides
    # with any other gang on the machine, and a stale rendezvous would hang the new one).
    master_port: int | None = Field(default=None, ge=1, le=65535)
    checkpoint_dir: Path | None = None
    # A checkpoint directory counts once this file exists in it (the reference trainer writes
    # COMMITTED last); a directory without it is torn and never resumed from.
    checkpoint_marker: str = "COMMITTED"
    # Each rank's node agent socket, e.g. "/run/sentinel/{node}.sock" on a simulated fleet;
    # given to the rank as SENTINEL_RANK_SOCKET.
    rank_socket_template: str | None = None
    heartbeat_s: float = Field(default=2.0, gt=0)
    poll_wait_s: float = Field(default=5.0, gt=0)
    # warm: rank processes outlive a repair (a node host per node and spare forks them with the
    # trainer imported; survivors leave a generation and join the next in process). cold: every
    # generation starts new processes. Warm needs the trainer as `python -m MODULE ...` whose
    # `main(argv)` may be called once per generation (sentinel.ranks).
    ranks: Literal["warm", "cold"] = "warm"
    # Data-parallel replicas as fault domains (the trainer's `--replicas ft --dp N`): the nodes
    # are N replicas of nodes/N each, met at a torchft lighthouse this supervisor runs; a fault
    # confined to one replica is repaired live (the others never stop). 1: one gang.
    replicas: int = Field(default=1, ge=1)
    # The repair path this job asks for every fault (live, warm_restart, restart), taken where
    # the fault allows it (the catalog's repair table) and the job can; unset: each fault's own.
    recovery: Recovery | None = None
    # Warm ranks: how long a healthy gang has to leave at a step boundary before its
    # connections are cut, and again before a rank that has not left is killed.
    leave_grace_s: float = Field(default=2.0, gt=0, le=60.0)
    # Stopping the gang: SIGTERM, this long for every rank to end, then SIGKILL to what is left
    # and a check that nothing survived. At most 25 s, so that with SIGKILL's own wait (5 s)
    # every rank is gone within 30 s of the stop (issue #22's bound for a hung gang).
    stop_grace_s: float = Field(default=10.0, gt=0, le=25.0)
    # Flight recorder: where the ranks dump on `fr.dump` (the hooks' fr_dir); when set, the
    # supervisor analyzes the dumps and reports `fr.analysis` for the playbook that asked.
    fr_dir: Path | None = None
    # Dumps are node-local: collect them from the coordinator, where each node's agent carried
    # its own (`agent.fr_dir`), instead of reading fr_dir.
    fr_from_coordinator: bool = False
    fr_wait_s: float = Field(default=30.0, gt=0)
    fr_analyze_command: list[str] = Field(
        default_factory=lambda: ["sentinel", "fr", "analyze"], min_length=1
    )

    @model_validator(mode="after")
    def _replicas_split_the_nodes(self) -> SupervisorConfig:
        if self.nodes % self.replicas:
            raise ValueError(
                f"replicas: {self.replicas} replicas cannot split {self.nodes} nodes evenly"
            )
        return self


class SentinelConfig(StrictModel):
    log: LogConfig = LogConfig()
    agent: AgentConfig = AgentConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    supervisor: SupervisorConfig = SupervisorConfig()


def _parse_file(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        doc = tomllib.loads(text) if path.suffix == ".toml" else parse_yaml(text, str(path))
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not valid TOML: {e}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InputError(f"{path}: the top level must be a mapping of sections")
    return doc


def _env_overrides(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Nested dict from `SENTINEL_SECTION__FIELD` variables, and each dotted field path's
    variable name (so a bad value is blamed on the variable, not the file).

    A double underscore marks a config override: one naming no section is a typo and an error.
    Single-underscore names (SENTINEL_JOB, SENTINEL_HOOKS_...) belong to the trainer hooks.
    """
    sections = set(SentinelConfig.model_fields)
    out: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if path[0] not in sections:
            raise ConfigError(
                "environment",
                [
                    f"{name}: no config section {path[0]!r} (sections: {', '.join(sorted(sections))})"
                ],
            )
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        names[".".join(path)] = name
    return out, names


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# Fields whose value may hold a secret (a URL with a password): never echoed in errors.
SECRET_FIELDS = frozenset({"store", "coordinator_url"})


def config_errors(err: ValidationError, env_names: Mapping[str, str] | None = None) -> list[str]:
    """One line per problem with its field path; `env_names` (path -> variable) names the
    environment variable a bad value came from."""
    lines = []
    for e in err.errors():
        if not e["loc"] and e["type"] == "value_error":
            # A check across fields: its message names each field's path, one problem a line.
            lines += str(e["ctx"]["error"]).splitlines()
            continue
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if env_names and path in env_names:
            path = f"{path} (from ${env_names[path]})"
        # A whole section as the input says nothing the path does not; a value says what is wrong.
        shown = (
            e["type"] != "missing"
            and not isinstance(e["input"], dict | list)
            and e["loc"][-1] not in SECRET_FIELDS
        )
        lines.append(f"{path}: {e['msg']}" + (f" (got {e['input']!r})" if shown else ""))
    return lines


class ConfigError(InputError):
    def __init__(self, source: str, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(f"{source}: invalid configuration:\n  " + "\n  ".join(errors))


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> SentinelConfig:
    """Read, merge and validate once. Raises ConfigError listing every problem with its path."""
    doc = _parse_file(path) if path is not None else {}
    overrides, env_names = _env_overrides(os.environ if env is None else env)
    doc = _merge(doc, overrides)
    try:
        return SentinelConfig.model_validate(doc)
    except ValidationError as e:
        errors = config_errors(e, env_names)
        from_env = all("(from $" in line for line in errors)
        source = "environment" if from_env or path is None else str(path)
        raise ConfigError(source, errors) from None
