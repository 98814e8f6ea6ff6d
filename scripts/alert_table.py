"""The alert table of docs/deployment.md, from deploy/prometheus/alerts.yml: one row an alert,
in the file's order. `python scripts/alert_table.py` prints it (a test fails while the page's
table differs)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "alerts.yml"


def markdown_alerts(rules: Path = RULES) -> str:
    head = "| alert | says | for | severity |\n|---|---|---|---|"
    rows = []
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for r in group["rules"]:
            if "alert" not in r:
                continue
            # a label the message names reads as the label's name: `{{ $labels.node }}` -> *node*
            says = re.sub(
                r"\{\{ \$(?:labels\.)?(\w+) \}\}",
                lambda m: f"*{m[1]}*",
                r["annotations"]["summary"],
            )
            rows.append(
                f"| `{r['alert']}` | {says} | {r.get('for', 'at once')} | {r['labels']['severity']} |"
            )
    return "\n".join((head, *rows)) + "\n"


if __name__ == "__main__":
    print(markdown_alerts(), end="")
