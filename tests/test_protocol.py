import json
import time

import pytest
from pydantic import ValidationError

from sentinel import protocol
from sentinel.protocol import (
    Action,
    Event,
    EventBatch,
    EventKind,
    Finding,
    GpuVerdict,
    JobState,
    JobStatusEvent,
    JobStatusPayload,
    NodeHealthEvent,
    NodeHealthPayload,
    ProtocolError,
    RankCrashEvent,
    RankCrashPayload,
    RankStepEvent,
    RankStepPayload,
    Source,
    Verdict,
    XidReport,
    decode_batch,
    decode_event,
    encode,
    make_event,
    new_id,
)


def _xid_event() -> Event:
    xid = XidReport(gpu=1, xid=79, name="GPU has fallen off the bus", action=Action.REBOOT_NODE)
    payload = NodeHealthPayload(verdict=Verdict.UNHEALTHY, action=Action.REBOOT_NODE, xids=[xid])
    return make_event(EventKind.NODE_HEALTH, Source(node="node-1"), payload)


def test_round_trip_is_exact() -> None:
    event = _xid_event()
    assert decode_event(encode(event)) == event
    batch = EventBatch(events=[event, _xid_event()])
    assert decode_batch(encode(batch)) == batch


def test_ids_are_unique() -> None:
    assert len({_xid_event().id for _ in range(1000)}) == 1000


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("{", "not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"kind": "node.health"}', "missing protocol version"),
        ('{"v": 2, "kind": "node.health"}', "unsupported protocol version 2"),
        (
            '{"v": 1, "kind": "gpu.melted", "source": {"node": "n"}}',
            "kind: unknown event kind 'gpu.melted'",
        ),
        ('{"v": 1, "source": {"node": "n"}}', "kind: Field required"),
        ('{"v": true, "kind": "node.health"}', "unsupported protocol version True"),
        ('{"v": 1.0, "kind": "node.health"}', "unsupported protocol version 1.0"),
        ('{"v": 1, "kind": "node.health", "source": {}}', "source: Value error, a source names"),
        (
            '{"v": 1, "kind": "node.health", "source": {"node": "n"}, "payload": {"action": "none"}}',
            "payload.verdict: Field required (a node.health event)",
        ),
        (
            '{"v": 1, "kind": "agent.heartbeat", "source": {"node": "n"}, "ts": -5, '
            '"payload": {"gpus": 8, "verdict": "healthy", "agent_version": "x"}}',
            "ts: Input should be greater than or equal to 0",
        ),
        (
            '{"v": 1, "kind": "agent.heartbeat", "source": {"node": "n"}, "extra": 1, '
            '"payload": {"gpus": 8, "verdict": "healthy", "agent_version": "x"}}',
            "extra: Extra inputs are not permitted",
        ),
        (
            '{"v": 1, "kind": "agent.heartbeat", "source": {"node": "bad node!"}, '
            '"payload": {"gpus": 8, "verdict": "healthy", "agent_version": "x"}}',
            "source.node: String should match pattern",
        ),
    ],
)
def test_malformed_messages_get_a_precise_reason(raw: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode_event(raw)
    assert reason in str(err.value)


def test_payload_is_normalised_so_equal_events_encode_equally() -> None:
    doc = json.loads(encode(_xid_event()))
    doc["payload"]["xids"][0].pop("repeats_in_window")  # a default the sender left out
    event = decode_event(doc)
    assert isinstance(event, NodeHealthEvent)
    assert event.payload.xids[0].repeats_in_window == 1
    assert encode(event) == encode(_xid_event().model_copy(update={"id": event.id, "ts": event.ts}))


def test_batch_size_is_bounded() -> None:
    event = json.loads(encode(_xid_event()))
    with pytest.raises(ProtocolError, match="events: List should have at most"):
        decode_batch({"v": 1, "events": [event] * 10_001})


def test_a_job_reports_a_bounded_gang() -> None:
    """The coordinator walks a job's ranks (who has not answered a stacks request): a job of
    10^12 ranks, which an API fuzzer sent, would hold a request for hours."""
    status = {
        "state": "running",
        "generation": 0,
        "world_size": protocol.MAX_WORLD_SIZE + 1,
        "gpus_per_node": 8,
        "nodes": ["node-0"],
        "spares": [],
        "checkpoints": [],
    }
    event = {
        "v": 1,
        "id": "e1",
        "kind": "job.status",
        "source": {"job": "j"},
        "ts": 1.0,
        "payload": status,
    }
    with pytest.raises(ProtocolError, match="world_size: Input should be less than or equal"):
        decode_batch({"v": 1, "events": [event]})


_WELL_FORMED: list[Event] = [
    _xid_event(),
    NodeHealthEvent(
        source=Source(node="node-2"),
        payload=NodeHealthPayload(
            verdict=Verdict.UNHEALTHY,
            action=Action.REBOOT_NODE,
            gpus=[
                GpuVerdict(
                    gpu=3,
                    verdict=Verdict.UNHEALTHY,
                    action=Action.REBOOT_NODE,
                    findings=[
                        Finding(
                            rule="xid_fatal",
                            verdict=Verdict.UNHEALTHY,
                            action=Action.REBOOT_NODE,
                            detail="x",
                        )
                    ],
                )
            ],
        ),
    ),
    JobStatusEvent(
        source=Source(job="job-1"),
        payload=JobStatusPayload(
            state=JobState.RUNNING, generation=2, world_size=8, nodes=["a", "b"]
        ),
    ),
    RankStepEvent(
        source=Source(node="node-1", rank=5, job="job-1"),
        payload=RankStepPayload(step=7, step_s=0.5, compute_s=0.4, comm_s=0.1, loss=3.25),
    ),
    RankCrashEvent(source=Source(node="node-1", rank=2, job="job-1")),
]


def test_every_kind_has_one_event_class_with_its_payload_model() -> None:
    assert set(protocol.EVENT_TYPES) == set(EventKind)
    for kind, cls in protocol.EVENT_TYPES.items():
        assert cls.model_fields["kind"].default is kind
        assert protocol.PAYLOAD_MODELS[kind] is cls.model_fields["payload"].annotation


def test_decoding_builds_each_kinds_class_with_a_typed_payload() -> None:
    batch = decode_batch(encode(EventBatch(events=_WELL_FORMED)))
    assert batch.events == _WELL_FORMED
    assert [type(e) for e in batch.events] == [type(e) for e in _WELL_FORMED]
    verdict = batch.events[1]
    assert isinstance(verdict, NodeHealthEvent)
    assert verdict.payload.gpus[0].verdict is Verdict.UNHEALTHY
    assert verdict.payload.gpus[0].findings[0].action is Action.REBOOT_NODE
    # a dict (as a test or a tool holds a message) decodes the same way as its JSON
    assert decode_batch(json.loads(encode(batch))) == batch
    for event in _WELL_FORMED:
        assert decode_event(encode(event)) == event


def test_a_payload_model_of_another_kind_is_refused() -> None:
    payload = RankCrashPayload()
    with pytest.raises(ValidationError, match="payload"):
        make_event(EventKind.NODE_HEALTH, Source(node="n"), payload)


def test_every_message_states_its_version() -> None:
    """Models built here default `v`; a message on the wire must state it."""
    event = json.loads(encode(_xid_event()))
    del event["v"]
    with pytest.raises(ProtocolError, match="missing protocol version"):
        decode_event(json.dumps(event))
    with pytest.raises(ProtocolError, match="missing protocol version"):
        decode_batch(json.dumps({"events": [event]}))
    # inside a batch, the batch's version speaks for its events
    assert decode_batch(json.dumps({"v": 1, "events": [event]})).events[0].v == 1


def test_a_batch_with_one_bad_event_gets_that_events_reason() -> None:
    good = json.loads(encode(_xid_event()))
    bad = {**good, "id": "other", "payload": {"action": "none"}}
    with pytest.raises(ProtocolError, match=r"events\.1\.payload\.verdict: Field required"):
        decode_batch(json.dumps({"v": 1, "events": [good, bad]}))


def test_ids_sort_by_time() -> None:
    first = new_id()
    time.sleep(0.002)
    assert new_id() > first
    assert len(first) == 32
