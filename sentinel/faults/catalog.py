"""One meaning per fault: what every XID and every health rule means and what it asks for.

The agent's verdicts and the coordinator's playbook triggers both read this module, so a code
cannot mean "restart the job" on the node and "evict the node" in the control plane. It
depends on the wire protocol's vocabulary only (no agent or coordinator internals).

XIDs. Source: NVIDIA's Xid catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors,
"Analyzing Xid Errors with the Xid Catalog"), whose "Resolution Bucket (Immediate Action)" is
kept verbatim in `nvidia_action`. It is mapped onto Sentinel's `Action`:

    IGNORE -> none             RESTART_APP -> restart_job      RESET_GPU -> reset_gpu
    RESTART_BM -> reboot_node  CHECK_MECHANICALS -> drain_and_inspect

Where the catalog defers to a workflow (WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, ...) the row takes
the workflow's usual outcome. Two deliberate departures, both following gpud: XID 119/120 (GSP
timeout/error) recommend a node reboot rather than a GPU reset, because a wedged GSP rarely
survives a reset; and `escalates` marks faults whose repetition on the same GPU points at the
hardware (the evaluator then recommends drain_and_inspect, as gpud escalates reboot -> hardware
inspection). Pure application faults (13, 31, 43, 45, 69) do not escalate: the job is at fault.

Rules. `RULES` is the rule table: each health rule's verdict and action, when it raises, when it
clears and how long it holds after its condition last held (the agent's conditions live in
`sentinel.agent.health.judge` and `sentinel.agent.health.node_rules`, keyed by these names). The README and
docs/agent.md embed it as printed by `python -m sentinel.faults.catalog` (a test compares).
"""

from __future__ import annotations

from dataclasses import dataclass

from sentinel.protocol import Action, Verdict


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    name: str
    verdict: Verdict
    action: Action
    escalates: bool
    nvidia_action: str = ""  # the catalog's immediate-action bucket, verbatim


_H, _D, _U = Verdict.HEALTHY, Verdict.DEGRADED, Verdict.UNHEALTHY
_NONE, _JOB, _RESET = Action.NONE, Action.RESTART_JOB, Action.RESET_GPU
_REBOOT, _DRAIN = Action.REBOOT_NODE, Action.DRAIN_AND_INSPECT

# fmt: off
CATALOG: tuple[XidInfo, ...] = (
    XidInfo(8, "GPU stopped processing (idle timeout)", _D, _JOB, True, "RESTART_APP"),
    XidInfo(13, "Graphics engine exception", _D, _JOB, False, "RESTART_APP"),
    XidInfo(31, "GPU memory page fault (MMU fault)", _D, _JOB, False, "RESTART_APP"),
    XidInfo(32, "Invalid or corrupted push buffer stream (PBDMA)", _D, _JOB, True, "RESTART_APP"),
    XidInfo(43, "GPU stopped processing (channel reset)", _H, _NONE, False, "IGNORE"),
    XidInfo(45, "Preemptive cleanup (channel torn down)", _H, _NONE, False, "IGNORE"),
    XidInfo(46, "GPU timeout error", _U, _RESET, True, "RESET_GPU"),
    XidInfo(48, "Double-bit ECC error", _U, _RESET, True, "WORKFLOW_XID_48"),
    XidInfo(54, "Auxiliary power reduced clocking", _D, _DRAIN, False, "CHECK_MECHANICALS"),
    XidInfo(61, "Internal micro-controller breakpoint/warning", _U, _RESET, True, "RESET_GPU"),
    XidInfo(62, "Internal micro-controller halt (PMU halt)", _U, _RESET, True, "RESET_GPU"),
    XidInfo(63, "Row remapping / page retirement recorded", _D, _RESET, False, "IGNORE"),
    XidInfo(64, "Row remapping / page retirement failure", _U, _RESET, True, "RESET_GPU"),
    XidInfo(68, "NVDEC0 video decoder exception", _D, _JOB, True, "RESTART_APP"),
    XidInfo(69, "Graphics engine class error", _D, _JOB, False, "RESTART_APP"),
    XidInfo(74, "NVLink error", _U, _RESET, True, "WORKFLOW_NVLINK_ERR"),
    XidInfo(79, "GPU has fallen off the bus", _U, _REBOOT, True, "RESTART_BM"),
    XidInfo(92, "High single-bit ECC error rate", _D, _NONE, True, "IGNORE"),
    XidInfo(94, "Contained ECC error", _D, _JOB, True, "RESTART_APP"),
    XidInfo(95, "Uncontained ECC error", _U, _RESET, True, "RESET_GPU"),
    XidInfo(109, "Context switch timeout", _U, _RESET, True, "RESET_GPU"),
    XidInfo(110, "Security fault", _U, _RESET, True, "RESET_GPU"),
    XidInfo(119, "GSP RPC timeout", _U, _REBOOT, True, "RESET_GPU"),
    XidInfo(120, "GSP error", _U, _REBOOT, True, "RESET_GPU"),
    XidInfo(121, "C2C link corrected error", _D, _NONE, True, "IGNORE"),
    XidInfo(136, "NVLink link training failed (ALI)", _U, _RESET, True, "RESET_GPU"),
    XidInfo(137, "NVLink privilege error", _H, _NONE, False, "IGNORE"),
    XidInfo(140, "Unrecovered ECC error (escaped row remapping)", _U, _RESET, True, "RESET_GPU"),
    XidInfo(143, "GPU initialization error", _U, _RESET, True, "RESET_GPU"),
    XidInfo(144, "NVLink SAW error", _D, _RESET, True, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(145, "NVLink RLW error", _D, _RESET, True, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(146, "NVLink TLW error", _D, _RESET, True, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(147, "NVLink TREX error", _H, _NONE, False, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(148, "NVLink NVLPW control error", _H, _NONE, False, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(149, "NVLink NETIR error", _D, _RESET, True, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(150, "NVLink MSE error", _U, _RESET, True, "WORKFLOW_NVLINK5_ERR"),
    XidInfo(154, "GPU recovery action changed", _H, _NONE, False, "XID_154"),
    XidInfo(155, "NVLink software-defined error", _U, _RESET, True, "RESET_GPU"),
    XidInfo(158, "GPU fatal timeout", _U, _RESET, True, "RESET_GPU"),
)
# fmt: on

_BY_CODE: dict[int, XidInfo] = {info.code: info for info in CATALOG}


def describe(xid: int) -> XidInfo:
    """The catalog row for `xid`; an XID the catalog does not know is treated as a suspect fault:
    degraded, restart the job, escalating if it keeps coming back."""
    known = _BY_CODE.get(xid)
    if known is not None:
        return known
    return XidInfo(xid, f"Unknown Xid {xid}", _D, _JOB, True, "")


# --- the rule table ----------------------------------------------------------------------------

MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """A health rule's meaning: what it asks for, and its raise / clear / hold contract.

    A finding raises when `raises` holds, stays up at least `hold_s` after that last held, and
    then drops only once `clears` holds: the gap between the two is the rule's hysteresis, and
    the hold-down keeps a flapping signal to one incident per storm.
    """

    name: str
    verdict: Verdict
    action: Action
    raises: str
    clears: str
    hold_s: float
    scope: str = "gpu"  # "gpu": judged per GPU; "node": judged for the whole node


_N = "node"

# fmt: off
RULES: tuple[RuleInfo, ...] = (
    # -- GPU identity and presence
    RuleInfo("gpu_lost", _U, _REBOOT, "NVML answers GPU_IS_LOST", "the GPU answers again",
             10 * MINUTE),
    RuleInfo("gpu_missing", _U, _REBOOT,
             "fewer GPUs answer NVML than the node should have (config or PCI devices)",
             "every expected GPU answers", 5 * MINUTE, _N),
    RuleInfo("nvml_unresponsive", _U, _REBOOT,
             "an NVML call has not returned within its deadline",
             "the hung call returned and a full sweep completed", MINUTE, _N),
    # -- recovery action and reset state the driver requests
    RuleInfo("recovery_gpu_reset", _U, _RESET,
             "the driver requests a GPU reset (GPU_RESET, DRAIN_AND_RESET, BUS_RESET) "
             "or a call answers RESET_REQUIRED", "the driver requests nothing", 5 * MINUTE),
    RuleInfo("recovery_node_reboot", _U, _REBOOT,
             "the driver requests a node reboot (NODE_REBOOT, SYSTEM_REBOOT)",
             "the driver requests nothing", 5 * MINUTE),
    RuleInfo("recovery_drain", _U, _DRAIN,
             "the driver requests draining P2P traffic or an IMEX domain recovery",
             "the driver requests nothing", 5 * MINUTE),
    # -- memory
    RuleInfo("ecc_dbe_volatile", _U, _RESET, "volatile DBE count >= 1",
             "the count is back to 0 (after a GPU reset)", 0),
    RuleInfo("ecc_dbe_aggregate", _D, _NONE, "lifetime DBE count >= dbe_aggregate_degraded",
             "never while the count stays (a lifetime count)", 0),
    RuleInfo("retired_pages_limit", _U, _DRAIN, "retired pages >= retired_pages_unhealthy",
             "below the limit", 0),
    RuleInfo("retired_pages_pending", _D, _RESET, "a page retirement is pending",
             "nothing pending (after a reset)", 0),
    RuleInfo("row_remap_failure", _U, _DRAIN, "row remapping failed", "never (hardware)", 0),
    RuleInfo("row_remap_pending", _D, _RESET, "a row remap is pending",
             "nothing pending (after a reset)", 0),
    RuleInfo("remapped_rows_uncorrectable", _D, _NONE,
             "rows remapped after uncorrectable errors >= remapped_rows_uncorrectable_degraded",
             "below the limit", 0),
    RuleInfo("ecc_sbe_rate", _D, _NONE,
             "corrected ECC errors per minute over rate_window_s >= sbe_rate_degraded",
             "the rate falls below half the limit", 10 * MINUTE),
    # -- temperature and throttling (3 C of hysteresis)
    RuleInfo("gpu_temp_unhealthy", _U, _DRAIN, "GPU temperature >= gpu_temp_unhealthy_c",
             "below gpu_temp_unhealthy_c - temp_hysteresis_c", 5 * MINUTE),
    RuleInfo("gpu_temp_degraded", _D, _NONE, "GPU temperature >= gpu_temp_degraded_c",
             "below gpu_temp_degraded_c - temp_hysteresis_c", 5 * MINUTE),
    RuleInfo("mem_temp_unhealthy", _U, _DRAIN, "HBM temperature >= mem_temp_unhealthy_c",
             "below mem_temp_unhealthy_c - temp_hysteresis_c", 5 * MINUTE),
    RuleInfo("mem_temp_degraded", _D, _NONE, "HBM temperature >= mem_temp_degraded_c",
             "below mem_temp_degraded_c - temp_hysteresis_c", 5 * MINUTE),
    RuleInfo("hw_slowdown", _D, _DRAIN, "HW slowdown without a thermal or power-brake cause",
             "the bit is clear", 5 * MINUTE),
    RuleInfo("hw_thermal_slowdown", _D, _DRAIN, "HW thermal slowdown bit set",
             "the bit is clear", 5 * MINUTE),
    RuleInfo("hw_power_brake", _D, _DRAIN, "HW power-brake bit set", "the bit is clear",
             5 * MINUTE),
    RuleInfo("sw_thermal_slowdown", _D, _NONE, "SW thermal slowdown bit set",
             "the bit is clear", 5 * MINUTE),
    # -- links: judged as rates over rate_window_s, and link state against start
    RuleInfo("pcie_replay_rate", _D, _DRAIN,
             "PCIe replays per minute over rate_window_s >= pcie_replay_rate_degraded",
             "the rate falls below half the limit", 10 * MINUTE),
    RuleInfo("nvlink_error_rate", _D, _RESET,
             "NVLink CRC + replay errors per minute over rate_window_s >= nvlink_rate_degraded",
             "the rate falls below half the limit", 10 * MINUTE),
    RuleInfo("nvlink_down", _U, _RESET, "an NVLink link active at start is no longer active",
             "every link active at start is active again", 10 * MINUTE),
    # -- peers: one GPU odd compared with the others of its node
    RuleInfo("peer_outlier", _D, _NONE,
             "one signal off the node's other GPUs (past its usual place) by robust z >= "
             "outlier_z and its least effect (4 C, 60 MHz, 15% of the draw and 50 W, 20 errors/min), "
             "the same way, for outlier_polls (2) polls in a row",
             "every score below outlier_z / 2", 10 * MINUTE),
    # -- the host, from the kernel log
    RuleInfo("fs_read_only", _U, _DRAIN,
             "the kernel remounted the root or checkpoint filesystem read-only",
             "never (needs a person: fsck and remount)", 0, _N),
    RuleInfo("machine_check", _U, _DRAIN, "a machine-check (MCE) error in the kernel log",
             "hold_s after the last one", 30 * MINUTE, _N),
    RuleInfo("pcie_aer_fatal", _U, _REBOOT, "a fatal (uncorrectable) PCIe AER error",
             "hold_s after the last one", 30 * MINUTE, _N),
    RuleInfo("hung_task", _D, _DRAIN, "a task blocked in D state for longer than the kernel's "
             "hung-task timeout", "hold_s after the last one", 10 * MINUTE, _N),
    RuleInfo("unknown_signal", _D, _NONE,
             "a kernel-log line, XID or recovery-action value the catalog cannot read",
             "hold_s after the last one", 10 * MINUTE, _N),
)
# fmt: on

RULE_BY_NAME: dict[str, RuleInfo] = {r.name: r for r in RULES}


def rule(name: str) -> RuleInfo:
    return RULE_BY_NAME[name]


# --- stragglers: one pair of thresholds ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StragglerThresholds:
    """What a straggler's slowdown means (`trainer_hooks.straggler`: a rank's compute over its
    peers', over its own normal). At `named` the rank reports itself (`rank.straggler`: on the
    dashboards, in the alert, in an incident's evidence); at `acted_on` the shipped straggler
    playbook swaps its node for a spare (a rank named below it reports again once it grows to
    it). Between the two a slowdown is shown, not repaired: a
    swap costs a checkpoint and a restart, which a few percent does not repay. The hooks' default
    threshold is `named` and `playbooks/straggler.yaml` triggers at `acted_on` (a test compares)."""

    named: float
    acted_on: float


STRAGGLER = StragglerThresholds(named=1.03, acted_on=1.2)


# --- the driver's requested recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) ---------------

# nvmlDeviceGpuRecoveryAction_t value -> (NVIDIA's name, the rule it raises or None for "none").
RECOVERY_ACTIONS: dict[int, tuple[str, str | None]] = {
    0: ("NONE", None),
    1: ("GPU_RESET", "recovery_gpu_reset"),
    2: ("NODE_REBOOT", "recovery_node_reboot"),
    3: ("DRAIN_P2P", "recovery_drain"),
    4: ("DRAIN_AND_RESET", "recovery_gpu_reset"),
    5: ("RECOVER_IMEX_DOMAIN", "recovery_drain"),
    6: ("BUS_RESET", "recovery_gpu_reset"),
    7: ("SYSTEM_REBOOT", "recovery_node_reboot"),
}


# --- what a fault asks for, wherever it is named ----------------------------------------------


def asks(key: object) -> Action | None:
    """The catalog's action for an XID code (int), an XID finding (`xid_79`) or a rule name;
    None for a name the catalog does not know (it asks for nothing it can vouch for)."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return describe(key).action
    if isinstance(key, str):
        if key.startswith("xid_") and key[4:].isdigit():
            return describe(int(key[4:])).action
        info = RULE_BY_NAME.get(key)
        return None if info is None else info.action
    return None


def escalated_action(xid: int) -> Action:
    """What an XID asks for once it repeats within the window: drain_and_inspect for rows that
    escalate, the row's own action for the rest."""
    info = describe(xid)
    return _DRAIN if info.escalates else info.action


def is_known_xid(xid: int) -> bool:
    return xid in _BY_CODE


def _hold(seconds: float) -> str:
    return f"{seconds / MINUTE:g} min" if seconds and seconds % MINUTE == 0 else f"{seconds:g}"


def markdown_rules() -> str:
    """The rule table as Markdown, one row a rule, in `RULES`' order."""
    head = (
        "| Rule | Scope | Verdict | Action | Raises when | Clears when | Hold |\n"
        "|---|---|---|---|---|---|---|"
    )
    rows = (
        f"| `{r.name}` | {r.scope} | {r.verdict.value} | {r.action.value} | {r.raises} "
        f"| {r.clears} | {_hold(r.hold_s)} |"
        for r in RULES
    )
    return "\n".join((head, *rows)) + "\n"


if __name__ == "__main__":  # the table in README.md and docs/agent.md
    print(markdown_rules(), end="")
