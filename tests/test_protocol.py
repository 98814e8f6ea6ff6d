import json

import pytest

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
