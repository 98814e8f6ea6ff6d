"""Incidents and playbooks: what the coordinator opened, what it did, what it may still do.

Source: the coordinator's `/metrics` (`sentinel_coordinator_*`): incidents, actions, nodes and
jobs by state, the eviction budget left, event ingest. Incidents by kind and the time to detect
and to recover come from `sentinel_coordinator_incidents_opened_total{kind}` and the
`sentinel_coordinator_incident_{detect,recover}_seconds` histograms.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    GOOD_LOW,
    Panel,
    Query,
    Row,
    Spec,
    query_variable,
)

PANELS: list[Row | Panel] = [
    Row("Now"),
    Panel(
        "stat",
        "Open incidents",
        "Incidents open, being acted on, or escalated to a human.",
        [
            Query(
                'sum(sentinel_coordinator_incidents{instance=~"$instance", state=~"open|acting|escalated"})'
            )
        ],
        steps=((None, "green"), (1, "orange"), (5, "red")),
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Escalated",
        "Incidents no playbook could fix: a person has to look.",
        [Query('sum(sentinel_coordinator_incidents{instance=~"$instance", state="escalated"})')],
        steps=GOOD_LOW,
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Eviction budget left",
        "Evictions still allowed in the current window; at 0 the coordinator stops evicting and escalates instead.",
        [Query('min(sentinel_coordinator_eviction_budget_remaining{instance=~"$instance"})')],
        steps=((None, "red"), (1, "orange"), (2, "green")),
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Nodes evicted",
        "Nodes the coordinator took out of the fleet.",
        [
            Query(
                'sum(sentinel_coordinator_nodes{instance=~"$instance", state="evicted"}) or vector(0)'
            )
        ],
        steps=((None, "green"), (1, "orange")),
        w=6,
        h=5,
    ),
    Row("Incidents and actions"),
    Panel(
        "timeseries",
        "Incidents by state",
        "open → acting → mitigated/resolved, or failed/escalated.",
        [
            Query(
                'sum by (state) (sentinel_coordinator_incidents{instance=~"$instance"})',
                "{{state}}",
            )
        ],
        w=8,
        custom={
            "drawStyle": "line",
            "fillOpacity": 60,
            "lineWidth": 1,
            "stacking": {"group": "A", "mode": "normal"},
        },
    ),
    Panel(
        "bargauge",
        "Incidents opened by kind (time range)",
        "What broke, by incident kind, over the dashboard's time range.",
        [
            Query(
                'sort_desc(sum by (kind) (increase(sentinel_coordinator_incidents_opened_total{instance=~"$instance"}[$__range])))',
                "{{kind}}",
                instant=True,
            )
        ],
        steps=((None, "green"), (1, "orange")),
        w=8,
        options={
            "displayMode": "basic",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    ),
    Panel(
        "timeseries",
        "Playbook actions by state",
        "Actions the playbooks ran (evict, swap in a spare, roll back, skip batches, resume...).",
        [
            Query(
                'sum by (state) (sentinel_coordinator_actions{instance=~"$instance"})', "{{state}}"
            )
        ],
        w=8,
        custom={
            "drawStyle": "line",
            "fillOpacity": 60,
            "lineWidth": 1,
            "stacking": {"group": "A", "mode": "normal"},
        },
    ),
    Panel(
        "timeseries",
        "Time to detect and to recover",
        "From the fault's first signal to the incident (detect), and from the incident to the job running again (recover, incidents mitigated or resolved); median and 90th percentile over the incidents of the preceding hour.",
        [
            Query(
                'histogram_quantile(0.5, sum by (le) (increase(sentinel_coordinator_incident_detect_seconds_bucket{instance=~"$instance"}[1h])))',
                "detect p50",
            ),
            Query(
                'histogram_quantile(0.9, sum by (le) (increase(sentinel_coordinator_incident_detect_seconds_bucket{instance=~"$instance"}[1h])))',
                "detect p90",
            ),
            Query(
                'histogram_quantile(0.5, sum by (le) (increase(sentinel_coordinator_incident_recover_seconds_bucket{instance=~"$instance"}[1h])))',
                "recover p50",
            ),
            Query(
                'histogram_quantile(0.9, sum by (le) (increase(sentinel_coordinator_incident_recover_seconds_bucket{instance=~"$instance"}[1h])))',
                "recover p90",
            ),
        ],
        unit="s",
        steps=((None, "green"), (300, "orange"), (1800, "red")),
    ),
    Panel(
        "timeseries",
        "Nodes and jobs by state",
        "Fleet membership (active, cordoned, evicted, spare) and jobs.",
        [
            Query(
                'sum by (state) (sentinel_coordinator_nodes{instance=~"$instance"})',
                "nodes {{state}}",
            ),
            Query(
                'sum by (state) (sentinel_coordinator_jobs{instance=~"$instance"})',
                "jobs {{state}}",
            ),
        ],
    ),
    Row("Coordinator"),
    Panel(
        "timeseries",
        "Events ingested",
        "Events per second from agents and ranks, accepted or duplicate (agents retry).",
        [
            Query(
                'sum by (result) (rate(sentinel_coordinator_events_total{instance=~"$instance"}[$__rate_interval]))',
                "{{result}}",
            ),
            Query(
                'sum by (code) (rate(sentinel_coordinator_rejected_batches_total{instance=~"$instance"}[$__rate_interval]))',
                "rejected {{code}}",
            ),
            Query(
                'sum(rate(sentinel_coordinator_events_pruned_total{instance=~"$instance"}[$__rate_interval]))',
                "pruned (past retention)",
            ),
        ],
        unit="ops",
    ),
    Panel(
        "timeseries",
        "Ingest acknowledgement latency (p99)",
        "From a parsed batch to its durable acknowledgement; beside it the garbage collector's pauses, which stall every request behind them.",
        [
            Query(
                'histogram_quantile(0.99, sum by (le) (rate(sentinel_coordinator_ack_seconds_bucket{instance=~"$instance"}[$__rate_interval])))',
                "p99",
            ),
            Query(
                'histogram_quantile(0.99, sum by (le) (rate(sentinel_coordinator_gc_pause_seconds_bucket{instance=~"$instance"}[$__rate_interval])))',
                "GC pause p99",
            ),
        ],
        unit="s",
        steps=((None, "green"), (0.1, "orange"), (1, "red")),
    ),
    Panel(
        "timeseries",
        "Coordinator store on disk",
        "The SQLite database and its write-ahead log. The log holds about a second of commits; one that keeps growing means checkpoints are not keeping up (alert SentinelCoordinatorWalGrowing).",
        [
            Query(
                'max by (file) (sentinel_coordinator_store_bytes{instance=~"$instance"})',
                "{{file}}",
            )
        ],
        unit="bytes",
        steps=((None, "green"), (1000000000.0, "red")),
    ),
]

SPEC = Spec(
    uid="sentinel-incidents",
    title="Sentinel / Incidents and playbooks",
    description="Incidents by kind and state, playbook actions, the eviction budget left, time to detect and to recover, and the coordinator's own health.",
    tags=["incidents", "sentinel"],
    panels=PANELS,
    variables=[
        query_variable(
            "instance", "Coordinator", 'label_values(up{job="sentinel-coordinator"}, instance)'
        )
    ],
    annotations=[],
)
