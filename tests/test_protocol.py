import json
import time

import pytest

from sentinel import protocol
from sentinel.protocol import (
    Action,
    Event,
    EventBatch,
    EventKind,
    ProtocolError,
    Source,
    XidPayload,
    decode_batch,
    decode_event,
    encode,
    make_event,
    new_id,
)


def _xid_event() -> Event:
    payload = XidPayload(
        gpu=1, xid=79, name="GPU has fallen off the bus", action=Action.REBOOT_NODE
    )
    return make_event(EventKind.GPU_XID, Source(node="node-1"), payload)


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
        ('{"kind": "gpu.xid"}', "missing protocol version"),
        ('{"v": 2, "kind": "gpu.xid"}', "unsupported protocol version 2"),
        ('{"v": 1, "kind": "gpu.melted", "source": {"node": "n"}}', "kind: Input should be"),
        ('{"v": 1, "kind": "gpu.xid", "source": {}}', "source: Value error, a source names"),
        (
            '{"v": 1, "kind": "gpu.xid", "source": {"node": "n"}, "payload": {"gpu": 0}}',
            "not a valid gpu.xid payload: xid: Field required",
        ),
        (
            '{"v": 1, "kind": "agent.heartbeat", "source": {"node": "n"}, "ts": -5, '
            '"payload": {"gpus": 8, "verdict": "healthy", "agent_version": "x"}}',
            "ts: Value error, timestamp must be finite",
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
    doc["payload"].pop("repeats_in_window")  # a default the sender left out
    assert decode_event(doc).payload["repeats_in_window"] == 1


def test_batch_size_is_bounded() -> None:
    event = json.loads(encode(_xid_event()))
    with pytest.raises(ProtocolError, match="events: List should have at most"):
        decode_batch({"v": 1, "events": [event] * 10_001})


_WELL_FORMED = [
    _xid_event(),
    Event(
        kind=EventKind.GPU_VERDICT,
        source=Source(node="node-2"),
        payload={
            "gpu": 3,
            "verdict": "unhealthy",
            "action": "reboot_node",
            "findings": [
                {
                    "rule": "xid_fatal",
                    "verdict": "unhealthy",
                    "action": "reboot_node",
                    "detail": "x",
                }
            ],
        },
    ),
    Event(
        kind=EventKind.JOB_STATUS,
        source=Source(job="job-1"),
        payload={"state": "running", "generation": 2, "world_size": 8, "nodes": ["a", "b"]},
    ),
    Event(
        kind=EventKind.RANK_STEP,
        source=Source(node="node-1", rank=5, job="job-1"),
        payload={"step": 7, "step_s": 0.5, "compute_s": 0.4, "comm_s": 0.1, "loss": 3.25},
    ),
]


def test_fast_path_builds_what_the_full_validation_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Well-formed messages skip `Event`'s Python validators; the result must not differ."""
    raw = encode(EventBatch(events=_WELL_FORMED))
    slow = EventBatch.model_validate(json.loads(raw))
    one_slow = Event.model_validate(json.loads(encode(_WELL_FORMED[1])))

    def refuse(*_args: object) -> None:
        raise AssertionError("took the slow path")

    monkeypatch.setattr(protocol, "_decode", refuse)
    fast = decode_batch(raw)
    assert fast == slow
    assert [e.payload for e in fast.events] == [e.payload for e in slow.events]
    assert encode(fast) == encode(slow)
    assert decode_event(encode(_WELL_FORMED[1])) == one_slow


def test_a_batch_with_one_bad_event_gets_that_events_reason() -> None:
    good = json.loads(encode(_xid_event()))
    bad = {**good, "id": "other", "payload": {"gpu": 0}}
    with pytest.raises(ProtocolError, match=r"events\.1\.payload: .*xid: Field required"):
        decode_batch(json.dumps({"v": 1, "events": [good, bad]}))


def test_ids_sort_by_time() -> None:
    first = new_id()
    time.sleep(0.002)
    assert new_id() > first
    assert len(first) == 32
