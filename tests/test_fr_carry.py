"""Flight-recorder dumps stay on their node: the agent carries them to the coordinator, where
only that node may put them and the job's supervisor reads them back."""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.error
from pathlib import Path

import aiohttp
from coord_util import Coordinator

from sentinel.agent.uplink.fr_carry import FrCarrier
from sentinel.failover import Coordinators


def _status(coord: Coordinator, method: str, path: str, token: str, body: bytes | None) -> int:
    try:
        coord.call(method, path, token, body)
    except urllib.error.HTTPError as e:
        return e.code
    return 200


def test_only_the_node_puts_its_dumps_and_the_job_reads_them(coord: Coordinator) -> None:
    node1 = coord.token("--role", "node", "--node", "node-1")
    job = coord.token("--role", "job", "--job", "j")
    assert _status(coord, "PUT", "/v1/fr/chk-1/node-1/fr_0", node1, b"\x00dump") == 200
    assert _status(coord, "PUT", "/v1/fr/chk-1/node-2/fr_2", node1, b"lie") == 403
    for bad in ("..", ".hidden", "a%2Fb"):
        assert _status(coord, "PUT", f"/v1/fr/chk-1/node-1/{bad}", node1, b"x") in (400, 404)
    assert _status(coord, "GET", "/v1/fr/chk-1", node1, None) == 403
    doc = coord.call("GET", "/v1/fr/chk-1", job)
    assert [(f["node"], f["name"], base64.b64decode(f["data"])) for f in doc["files"]] == [  # type: ignore[index]
        ("node-1", "fr_0", b"\x00dump")
    ]


async def test_the_agent_carries_fresh_dumps_once_settled(
    coord: Coordinator, tmp_path: Path
) -> None:
    fr = tmp_path / "fr"
    fr.mkdir()
    (fr / "fr_9").write_bytes(b"old")  # an earlier check's dump: not carried
    since = time.time() + 0.01
    time.sleep(0.05)
    for name in ("fr_2", "fr_2.json", "fr_3", "fr_3.json", ".fr_4.tmp1"):
        (fr / name).write_bytes(name.encode())
    token = coord.token("--role", "node", "--node", "node-1")
    carrier = FrCarrier(fr, "node-1", wait_s=10, settle_s=0.3)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as s:
        assert await carrier.carry(s, Coordinators(coord.url), "chk-2", since, ranks=2) == 4
    admin = coord.token("--role", "admin")
    names = sorted(f["name"] for f in coord.call("GET", "/v1/fr/chk-2", admin)["files"])  # type: ignore[index]
    assert names == ["fr_2", "fr_2.json", "fr_3", "fr_3.json"]


async def test_a_later_dump_under_the_same_name_never_replaces_the_one_asked_for(
    coord: Coordinator, tmp_path: Path
) -> None:
    """A repair's teardown makes each rank dump again as it exits, under the same names: the
    evidence the command asked for is the one carried."""
    fr = tmp_path / "fr"
    fr.mkdir()
    since = time.time() - 0.01
    for name in ("fr_2", "fr_2.json"):
        (fr / name).write_bytes(b"evidence " + name.encode())
    token = coord.token("--role", "node", "--node", "node-1")
    carrier = FrCarrier(fr, "node-1", wait_s=10, settle_s=1.0)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as s:
        carrying = asyncio.create_task(
            carrier.carry(s, Coordinators(coord.url), "chk-3", since, ranks=1)
        )
        await asyncio.sleep(0.7)  # both read whole; the carrier waits for more to settle
        (fr / "fr_2").write_bytes(b"teardown dump")
        assert await carrying == 2
    admin = coord.token("--role", "admin")
    files = {
        f["name"]: base64.b64decode(f["data"])
        for f in coord.call("GET", "/v1/fr/chk-3", admin)["files"]
    }  # type: ignore[index]
    assert files == {"fr_2": b"evidence fr_2", "fr_2.json": b"evidence fr_2.json"}
