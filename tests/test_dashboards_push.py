"""`sentinel dashboards push` against a stand-in Grafana.

There is no Grafana server package on these machines, so this test runs a small aiohttp server
implementing the Grafana HTTP API calls the command makes (GET/POST /api/folders,
GET /api/dashboards/uid/{uid}, POST /api/dashboards/db) with Grafana's status codes and bearer
token auth. The command itself runs as a real subprocess through grafana-client.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from sentinel.dashboards import build_all
from sentinel.processes import free_port

TOKEN = "glsa_test_token"


@dataclass
class FakeGrafana:
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    auth_headers: list[str | None] = field(default_factory=list)
    posts: int = 0

    def app(self) -> web.Application:
        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            header = request.headers.get("Authorization")
            self.auth_headers.append(header)
            if header != f"Bearer {TOKEN}":
                return web.json_response({"message": "Unauthorized"}, status=401)
            return await handler(request)

        app = web.Application(middlewares=[auth])
        app.router.add_get("/api/folders", self.list_folders)
        app.router.add_post("/api/folders", self.create_folder)
        app.router.add_get("/api/dashboards/uid/{uid}", self.get_dashboard)
        app.router.add_post("/api/dashboards/db", self.save_dashboard)
        return app

    async def list_folders(self, request: web.Request) -> web.Response:
        return web.json_response([{"uid": u, "title": f["title"]} for u, f in self.folders.items()])

    async def create_folder(self, request: web.Request) -> web.Response:
        body = await request.json()
        uid = body.get("uid") or f"f{len(self.folders)}"
        if uid in self.folders or any(f["title"] == body["title"] for f in self.folders.values()):
            return web.json_response(
                {"message": "a folder with that name or uid exists"}, status=409
            )
        self.folders[uid] = {"uid": uid, "title": body["title"]}
        return web.json_response(self.folders[uid])

    async def get_dashboard(self, request: web.Request) -> web.Response:
        stored = self.dashboards.get(request.match_info["uid"])
        if stored is None:
            return web.json_response({"message": "Dashboard not found"}, status=404)
        return web.json_response(stored)

    async def save_dashboard(self, request: web.Request) -> web.Response:
        self.posts += 1
        body = await request.json()
        dash, uid = body["dashboard"], body["dashboard"]["uid"]
        if body.get("folderUid") not in self.folders:
            return web.json_response({"message": "folder not found"}, status=400)
        old = self.dashboards.get(uid)
        if old is not None and not body.get("overwrite"):
            return web.json_response({"message": "version-mismatch"}, status=412)
        version = old["dashboard"]["version"] + 1 if old else 1
        self.dashboards[uid] = {
            "dashboard": dash | {"version": version},
            "meta": {"folderUid": body["folderUid"]},
        }
        return web.json_response(
            {"status": "success", "uid": uid, "version": version, "url": f"/d/{uid}/x", "id": 1}
        )


@pytest.fixture
def grafana() -> Iterator[tuple[FakeGrafana, str]]:
    fake, port = FakeGrafana(), free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def push(sentinel_cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sentinel_cmd, "dashboards", "push", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_push_creates_then_updates_without_duplicates(
    grafana: tuple[FakeGrafana, str], sentinel_cmd: list[str]
) -> None:
    fake, url = grafana
    built = build_all()
    first = push(sentinel_cmd, "--url", url, "--token", TOKEN, "--folder", "GPU fleet", "--json")
    assert first.returncode == 0, first.stderr
    rows = json.loads(first.stdout)
    assert [r["action"] for r in rows] == ["created"] * len(built)
    assert list(fake.folders) == ["gpu-fleet"]
    assert set(fake.dashboards) == {d["uid"] for d in built.values()}
    for d in built.values():
        stored = fake.dashboards[d["uid"]]
        assert stored["dashboard"]["panels"] == d["panels"]
        assert stored["meta"]["folderUid"] == "gpu-fleet"

    second = push(sentinel_cmd, "--url", url, "--token", TOKEN, "--folder", "GPU fleet", "--json")
    assert second.returncode == 0, second.stderr
    rows = json.loads(second.stdout)
    assert [r["action"] for r in rows] == ["updated"] * len(built)
    assert {r["version"] for r in rows} == {2}
    assert len(fake.folders) == 1 and len(fake.dashboards) == len(built)
    assert fake.posts == 2 * len(built)
    assert fake.auth_headers and set(fake.auth_headers) == {f"Bearer {TOKEN}"}


def test_push_reuses_a_folder_found_by_title(
    grafana: tuple[FakeGrafana, str], sentinel_cmd: list[str]
) -> None:
    fake, url = grafana
    fake.folders["abc123"] = {"uid": "abc123", "title": "Sentinel"}
    r = push(sentinel_cmd, "--url", url, "--token", TOKEN)
    assert r.returncode == 0, r.stderr
    assert list(fake.folders) == ["abc123"]
    assert {d["meta"]["folderUid"] for d in fake.dashboards.values()} == {"abc123"}
    assert "4 dashboards in folder 'Sentinel'" in r.stdout


def test_wrong_token_is_refused_with_a_clear_message(
    grafana: tuple[FakeGrafana, str], sentinel_cmd: list[str]
) -> None:
    fake, url = grafana
    r = push(sentinel_cmd, "--url", url, "--token", "wrong")
    assert r.returncode == 2
    assert "401 Unauthorized: the token was refused" in r.stderr
    assert fake.dashboards == {} and fake.folders == {}
    assert fake.auth_headers[0] == "Bearer wrong"


def test_bad_and_unreachable_urls(sentinel_cmd: list[str]) -> None:
    r = push(sentinel_cmd, "--url", "grafana.example", "--token", TOKEN)
    assert r.returncode == 2 and "--url must be an http(s) URL" in r.stderr
    nobody = f"http://127.0.0.1:{free_port()}"
    r = push(sentinel_cmd, "--url", nobody, "--token", TOKEN, "--timeout", "3")
    assert (
        r.stderr.strip()
        == f"sentinel: cannot reach Grafana at {nobody}: [Errno 111] Connection refused"
    )


def test_push_from_a_directory(
    grafana: tuple[FakeGrafana, str], sentinel_cmd: list[str], tmp_path: Any
) -> None:
    fake, url = grafana
    (tmp_path / "mine.json").write_text(json.dumps({"uid": "mine", "title": "Mine", "panels": []}))
    r = push(sentinel_cmd, "--url", url, "--token", TOKEN, "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert list(fake.dashboards) == ["mine"]
    (tmp_path / "broken.json").write_text("{")
    r = push(sentinel_cmd, "--url", url, "--token", TOKEN, "--dir", str(tmp_path))
    assert r.returncode == 2 and "broken.json" not in r.stdout and "--dir" in r.stderr
    assert list(fake.dashboards) == ["mine"]
