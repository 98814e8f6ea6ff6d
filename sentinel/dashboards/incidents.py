"""Incidents and playbooks: what the coordinator opened, what it did, what it may still do.

Source: the coordinator's `/metrics` (`sentinel_coordinator_*`): incidents, actions, nodes and
jobs by state, the eviction budget left, event ingest. Incidents by kind and the time to detect
and to recover come from `sentinel_coordinator_incidents_opened_total{kind}` and the
`sentinel_coordinator_incident_{detect,recover}_seconds` histograms.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    JSON,
    TIMESERIES_CUSTOM,
    Dashboard,
    Query,
    query_variable,
    stat_options,
    timeseries_options,
)

INST = 'instance=~"$instance"'
STACKED = TIMESERIES_CUSTOM | {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60}


def build() -> JSON:
    d = Dashboard(
        uid="sentinel-incidents",
        title="Sentinel / Incidents and playbooks",
        description="Incidents by kind and state, playbook actions, the eviction budget left, "
        "time to detect and to recover, and the coordinator's own health.",
        tags=["sentinel", "incidents"],
        variables=[
            query_variable(
                "instance", "Coordinator", 'label_values(up{job="sentinel-coordinator"}, instance)'
            )
        ],
    )
    d.row("Now")
    d.add(
        "stat",
        "Open incidents",
        "Incidents open, being acted on, or escalated to a human.",
        [Query(f'sum(sentinel_coordinator_incidents{{{INST}, state=~"open|acting|escalated"}})')],
        "none",
        ((None, "green"), (1, "orange"), (5, "red")),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Escalated",
        "Incidents no playbook could fix: a person has to look.",
        [Query(f'sum(sentinel_coordinator_incidents{{{INST}, state="escalated"}})')],
        "none",
        ((None, "green"), (1, "red")),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Eviction budget left",
        "Evictions still allowed in the current window; at 0 the coordinator stops evicting and "
        "escalates instead.",
        [Query(f"min(sentinel_coordinator_eviction_budget_remaining{{{INST}}})")],
        "none",
        ((None, "red"), (1, "orange"), (2, "green")),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Nodes evicted",
        "Nodes the coordinator took out of the fleet.",
        [Query(f'sum(sentinel_coordinator_nodes{{{INST}, state="evicted"}}) or vector(0)')],
        "none",
        ((None, "green"), (1, "orange")),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.row("Incidents and actions")
    d.add(
        "timeseries",
        "Incidents by state",
        "open → acting → mitigated/resolved, or failed/escalated.",
        [Query(f"sum by (state) (sentinel_coordinator_incidents{{{INST}}})", "{{state}}")],
        "none",
        ((None, "green"),),
        w=8,
        options=timeseries_options(),
        custom=STACKED,
    )
    d.add(
        "bargauge",
        "Incidents opened by kind (time range)",
        "What broke, by incident kind, over the dashboard's time range.",
        [
            Query(
                f"sort_desc(sum by (kind) (increase(sentinel_coordinator_incidents_opened_total{{{INST}}}[$__range])))",
                "{{kind}}",
                instant=True,
            )
        ],
        "none",
        ((None, "green"), (1, "orange")),
        w=8,
        options={
            "displayMode": "basic",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    )
    d.add(
        "timeseries",
        "Playbook actions by state",
        "Actions the playbooks ran (evict, swap in a spare, roll back, skip batches, resume...).",
        [Query(f"sum by (state) (sentinel_coordinator_actions{{{INST}}})", "{{state}}")],
        "none",
        ((None, "green"),),
        w=8,
        options=timeseries_options(),
        custom=STACKED,
    )
    d.add(
        "timeseries",
        "Time to detect and to recover",
        "From the fault's first signal to the incident (detect), and from the incident to the "
        "job running again (recover, incidents mitigated or resolved); median and 90th "
        "percentile over the incidents of the preceding hour.",
        [
            Query(
                f"histogram_quantile({q}, sum by (le) (increase(sentinel_coordinator_incident_{what}_seconds_bucket{{{INST}}}[1h])))",
                f"{what} p{int(q * 100)}",
            )
            for what in ("detect", "recover")
            for q in (0.5, 0.9)
        ],
        "s",
        ((None, "green"), (300, "orange"), (1800, "red")),
        w=12,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Nodes and jobs by state",
        "Fleet membership (active, cordoned, evicted, spare) and jobs.",
        [
            Query(f"sum by (state) (sentinel_coordinator_nodes{{{INST}}})", "nodes {{state}}"),
            Query(f"sum by (state) (sentinel_coordinator_jobs{{{INST}}})", "jobs {{state}}"),
        ],
        "none",
        ((None, "green"),),
        w=12,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.row("Coordinator")
    d.add(
        "timeseries",
        "Events ingested",
        "Events per second from agents and ranks, accepted or duplicate (agents retry).",
        [
            Query(
                f"sum by (result) (rate(sentinel_coordinator_events_total{{{INST}}}[$__rate_interval]))",
                "{{result}}",
            ),
            Query(
                f"sum by (code) (rate(sentinel_coordinator_rejected_batches_total{{{INST}}}[$__rate_interval]))",
                "rejected {{code}}",
            ),
            Query(
                f"sum(rate(sentinel_coordinator_events_pruned_total{{{INST}}}[$__rate_interval]))",
                "pruned (past retention)",
            ),
        ],
        "ops",
        ((None, "green"),),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Ingest acknowledgement latency (p99)",
        "From a parsed batch to its durable acknowledgement; beside it the garbage collector's"
        " pauses, which stall every request behind them.",
        [
            Query(
                f"histogram_quantile(0.99, sum by (le) (rate(sentinel_coordinator_ack_seconds_bucket{{{INST}}}[$__rate_interval])))",
                "p99",
            ),
            Query(
                f"histogram_quantile(0.99, sum by (le) (rate(sentinel_coordinator_gc_pause_seconds_bucket{{{INST}}}[$__rate_interval])))",
                "GC pause p99",
            ),
        ],
        "s",
        ((None, "green"), (0.1, "orange"), (1, "red")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Coordinator store on disk",
        "The SQLite database and its write-ahead log. The log holds about a second of commits;"
        " one that keeps growing means checkpoints are not keeping up"
        " (alert SentinelCoordinatorWalGrowing).",
        [
            Query(f"max by (file) (sentinel_coordinator_store_bytes{{{INST}}})", "{{file}}"),
        ],
        "bytes",
        ((None, "green"), (1e9, "red")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    return d.to_json()
