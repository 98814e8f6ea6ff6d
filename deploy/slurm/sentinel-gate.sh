#!/bin/bash
# Gate a Slurm node on the Sentinel agent's health verdict: `sentinel-gate.sh prolog|epilog`.
# prolog.sh and epilog.sh call this; slurmd runs them as root on the compute node.
#
# Unhealthy (sentinel_node_health_verdict{verdict="unhealthy"} 1 on the agent's /metrics):
#   drain the node with the firing rules and the recommended action as the reason, then
#   prolog: exit 1 (Slurm requeues the job elsewhere); epilog: exit 0 (the job is over).
# Agent unreachable or stale (/healthz not 200): warn and let the job run, unless
#   SENTINEL_GATE_STRICT=1, which drains: an agent outage should not drain a whole fleet.
# SENTINEL_GATE_BURNIN=1 (prolog only): also run a quick single-node burn-in; drain if it fails.
set -euo pipefail

MODE="${1:-}"
AGENT_URL="${SENTINEL_AGENT_URL:-http://127.0.0.1:9410}"
TIMEOUT_S="${SENTINEL_GATE_TIMEOUT_S:-5}"
STRICT="${SENTINEL_GATE_STRICT:-0}"
BURNIN="${SENTINEL_GATE_BURNIN:-0}"
SENTINEL="${SENTINEL_BIN:-sentinel}"
NODE="$(hostname -s)"

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

if ! curl -fsS --max-time "$TIMEOUT_S" -o /dev/null "$AGENT_URL/healthz"; then
  if [ "$STRICT" = 1 ]; then drain "agent at $AGENT_URL not answering or its sweeps are stale"; fi
  log "agent at $AGENT_URL not answering or stale; not gating (SENTINEL_GATE_STRICT=1 drains)"
  exit 0
fi

metrics="$(curl -fsS --max-time "$TIMEOUT_S" "$AGENT_URL/metrics")" || {
  if [ "$STRICT" = 1 ]; then drain "agent /metrics unreadable"; fi
  log "agent /metrics unreadable; not gating"
  exit 0
}

value_re='\} 1(\.0+)?$'
if grep -Eq "^sentinel_node_health_verdict\{[^}]*verdict=\"unhealthy\"[^}]*$value_re" <<<"$metrics"; then
  rules="$(grep -E "^sentinel_gpu_health_finding\{[^}]*verdict=\"unhealthy\"[^}]*$value_re" <<<"$metrics" |
    sed -E 's/.*gpu="([^"]*)".*rule="([^"]*)".*/gpu\1 \2/' | sort -u | paste -sd, - || true)"
  action="$(grep -E "^sentinel_node_recommended_action\{[^}]*$value_re" <<<"$metrics" |
    sed -E 's/.*action="([^"]*)".*/\1/' | head -n1 || true)"
  drain "unhealthy: ${rules:-see agent} (action: ${action:-unknown})"
fi

if [ "$MODE" = prolog ] && [ "$BURNIN" = 1 ]; then
  report="$(mktemp /tmp/sentinel-burnin.XXXXXX.json)"
  if ! "$SENTINEL" burnin --quick --json "$report" >&2; then
    drain "quick burn-in failed (report $report)"
  fi
  rm -f "$report"
fi

log "healthy"
exit 0
