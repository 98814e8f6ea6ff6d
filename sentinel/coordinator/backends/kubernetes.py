"""Kubernetes: cordon and taint the node through the API server."""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any

from sentinel.coordinator.core.effects import EvictionBackend


class KubernetesBackend(EvictionBackend):
    """Cordon (spec.unschedulable) and taint the node; two API calls, both idempotent."""

    name = "kubernetes"

    def __init__(self, api: str, token: str | None, taint_key: str) -> None:
        self.api = api.rstrip("/")
        self.token = token
        self.taint_key = taint_key

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(f"{self.api}{path}", method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/strategic-merge-patch+json")
        context = ssl.create_default_context() if self.api.startswith("https") else None
        with urllib.request.urlopen(req, data=data, timeout=30, context=context) as resp:
            return json.loads(resp.read() or b"{}")

    def is_evicted(self, node: str) -> bool:
        current = self._call("GET", f"/api/v1/nodes/{node}")
        spec = current.get("spec", {})
        taints = spec.get("taints") or []
        return bool(spec.get("unschedulable")) and any(
            t.get("key") == self.taint_key for t in taints
        )

    def evict(self, node: str, reason: str) -> str:
        current = self._call("GET", f"/api/v1/nodes/{node}")
        taints = list(current.get("spec", {}).get("taints") or [])
        if not any(t.get("key") == self.taint_key for t in taints):
            taints.append({"key": self.taint_key, "value": "true", "effect": "NoSchedule"})
        self._call(
            "PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True, "taints": taints}}
        )
        return f"cordoned and tainted {node} ({self.taint_key}) through the Kubernetes API"
