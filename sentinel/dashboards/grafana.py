"""Provision dashboards into Grafana through grafana-client: find or create the folder, then
create or overwrite each dashboard by its uid, so pushing twice updates rather than duplicates."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from sentinel.dashboards.panels import JSON


class GrafanaLike(Protocol):
    """The part of `grafana_client.GrafanaApi` used here (`folder` and `dashboard` elements)."""

    folder: Any
    dashboard: Any


@dataclass(frozen=True)
class Pushed:
    name: str
    uid: str
    title: str
    action: str  # "created" or "updated"
    version: int
    url: str


def folder_uid(name: str) -> str:
    """A stable folder uid from its name (Grafana allows 40 characters of [a-zA-Z0-9_-])."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")
    return (slug or "sentinel")[:40]


def ensure_folder(api: GrafanaLike, name: str) -> str:
    for f in api.folder.get_all_folders():
        if f.get("title") == name:
            return str(f["uid"])
    created = api.folder.create_folder(name, uid=folder_uid(name))
    return str(created["uid"])


def push(
    api: GrafanaLike, dashboards: dict[str, JSON], folder: str, client_error: type[Exception]
) -> list[Pushed]:
    """`client_error` is the client's 4xx error: a 404 on lookup means "not there yet"."""
    uid_of_folder = ensure_folder(api, folder)
    out = []
    for name, dashboard in dashboards.items():
        uid = dashboard["uid"]
        try:
            api.dashboard.get_dashboard(uid)
            action = "updated"
        except client_error as e:
            if getattr(e, "status_code", None) != 404:
                raise
            action = "created"
        body = {
            "dashboard": dashboard | {"id": None},
            "folderUid": uid_of_folder,
            "overwrite": True,
            "message": "sentinel dashboards push",
        }
        r = api.dashboard.update_dashboard(body)
        out.append(
            Pushed(
                name, uid, dashboard["title"], action, int(r.get("version", 0)), r.get("url", "")
            )
        )
    return out
