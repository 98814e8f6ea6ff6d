#!/bin/bash
# Gate a Slurm node on the Sentinel agent's health verdict: `sentinel-gate.sh prolog|epilog`.
# prolog.sh and epilog.sh call this; slurmd runs them as root on the compute node.
#
# Unhealthy (sentinel_node_health_verdict{verdict="unhealthy"} 1 on the agent's /metrics):
#   drain the node with the firing rules and the recommended action as the reason, then
#   prolog: exit 1 (Slurm requeues the job elsewhere); epilog: exit 0 (the job is over).
# Agent unreachable or stale (/healthz not 200): warn and go on, unless SENTINEL_GATE_STRICT=1,
#   which drains: an agent outage should not drain a whole fleet.
# SENTINEL_GATE_BURNIN=1 (prolog only): also run a quick burn-in of this node's GPUs
#   (SENTINEL_GATE_BURNIN_CMD, default one rank per GPU through torchrun); drain if it fails.
#
# slurmd runs prologs with a bare environment (SLURM_* only, no PATH): settings go in
# gate.env beside this script (KEY=VALUE lines, sourced), or the file SENTINEL_GATE_ENV names.
set -euo pipefail

MODE="${1:-}"
GATE_ENV="${SENTINEL_GATE_ENV:-$(dirname "$(readlink -f "$0")")/gate.env}"
NODE="${SLURMD_NODENAME:-$(hostname -s)}"
if [ -r "$GATE_ENV" ]; then
  # shellcheck source=/dev/null
  . "$GATE_ENV"
fi
AGENT_URL="${SENTINEL_AGENT_URL:-http://127.0.0.1:9410}"
TIMEOUT_S="${SENTINEL_GATE_TIMEOUT_S:-5}"
STRICT="${SENTINEL_GATE_STRICT:-0}"
BURNIN="${SENTINEL_GATE_BURNIN:-0}"
SENTINEL="${SENTINEL_BIN:-sentinel}"
BURNIN_CMD="${SENTINEL_GATE_BURNIN_CMD:-torchrun --standalone --nproc-per-node=gpu --no-python $SENTINEL burnin --quick}"

log() { echo "sentinel-gate[$MODE] $NODE: $*" >&2; }

drain() {
  local reason="sentinel: $1"
  log "draining: $reason"
  scontrol update NodeName="$NODE" State=DRAIN Reason="${reason:0:200}"
  if [ "$MODE" = prolog ]; then exit 1; fi
  exit 0
}

case "$MODE" in
  prolog | epilog) ;;
  *)
    echo "usage: $0 prolog|epilog" >&2
    exit 2
    ;;
esac

# The agent's verdict: drains on unhealthy; an unreachable agent only warns (unless STRICT).
check_agent() {
  if ! curl -fsS --max-time "$TIMEOUT_S" -o /dev/null "$AGENT_URL/healthz"; then
    if [ "$STRICT" = 1 ]; then drain "agent at $AGENT_URL not answering or its sweeps are stale"; fi
    log "agent at $AGENT_URL not answering or stale; not gating on it (SENTINEL_GATE_STRICT=1 drains)"
    return 0
  fi
  local metrics
  metrics="$(curl -fsS --max-time "$TIMEOUT_S" "$AGENT_URL/metrics")" || {
    if [ "$STRICT" = 1 ]; then drain "agent /metrics unreadable"; fi
    log "agent /metrics unreadable; not gating on it"
    return 0
  }
  local value_re='\} 1(\.0+)?$'
  if grep -Eq "^sentinel_node_health_verdict\{[^}]*verdict=\"unhealthy\"[^}]*$value_re" <<<"$metrics"; then
    local rules action
    rules="$(grep -E "^sentinel_gpu_health_finding\{[^}]*verdict=\"unhealthy\"[^}]*$value_re" <<<"$metrics" |
      sed -E 's/.*gpu="([^"]*)".*rule="([^"]*)".*/gpu\1 \2/' | sort -u | paste -sd, - || true)"
    action="$(grep -E "^sentinel_node_recommended_action\{[^}]*$value_re" <<<"$metrics" |
      sed -E 's/.*action="([^"]*)".*/\1/' | head -n1 || true)"
    drain "unhealthy: ${rules:-see agent} (action: ${action:-unknown})"
  fi
}

# A quick burn-in of this node; on failure the reason carries the burn-in's own findings.
check_burnin() {
  local report why
  report="$(mktemp /tmp/sentinel-burnin.XXXXXX.json)"
  # shellcheck disable=SC2086  # the command is words on purpose
  if ! $BURNIN_CMD --json "$report" >&2; then
    why="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print("; ".join(r for n in d["nodes"].values() for r in n["reasons"])[:150])' "$report" 2>/dev/null || true)"
    drain "quick burn-in failed: ${why:-see $report}"
  fi
  rm -f "$report"
}

check_agent
if [ "$MODE" = prolog ] && [ "$BURNIN" = 1 ]; then check_burnin; fi
log "healthy"
exit 0
