"""NVIDIA's XID catalog as data: what each XID means and what an operator should do about it.

Source: NVIDIA's Xid catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors,
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
