"""Reading one JSON input file, with the error a user can act on (exit 2) when it cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sentinel.exitcodes import InputError


def read_json(path: Path, what: str = "") -> Any:
    """The parsed contents of `path`; `what` says what the file should have been."""
    hint = f" ({what})" if what else ""
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}{hint}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON: {e}{hint}") from None
