"""Reading the files a command is given, with the error a user can act on when one cannot be
read: an `InputError` naming the file and what is wrong (the CLI prints it on one line and exits
2), never a traceback. Every input file goes through `read_text`; YAML through `parse_yaml`,
which also refuses a mapping that names a key twice (YAML's loaders keep the last one silently,
dropping a whole section); JSON through `read_json`."""

from __future__ import annotations

import json
import os
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from sentinel.exitcodes import InputError


def read_text(path: Path, hint: str = "") -> str:
    """The UTF-8 text of `path`; `hint` says what the file should have been."""
    note = f" ({hint})" if hint else ""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}{note}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}){note}"
        ) from None


def read_json(path: Path, hint: str = "") -> Any:
    """The parsed contents of a JSON file."""
    text = read_text(path, hint)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        note = f" ({hint})" if hint else ""
        raise InputError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}{note}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, whose keys it may override
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if not isinstance(key, Hashable):
                continue  # SafeLoader's own error says so below
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, where: str) -> Any:
    """YAML text (from `where`, a file name) parsed as `yaml.safe_load` would, with a key named
    twice in one mapping refused."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        prefix = "" if problem.startswith("duplicate key") else "not valid YAML: "
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise InputError(f"{where}{at}: {prefix}{problem}") from None


def read_token(path: Path, option: str) -> str:
    """The token held in a token file (`option` is where it was named: `--token-file`)."""
    token = read_text(path, f"{option}: a file holding one token").strip()
    if not token:
        raise InputError(f"{option} {path}: the file is empty; it must hold a token")
    return token


def writable_dir(path: Path, option: str) -> Path:
    """`path`, created if missing, as a directory this process can write in (`option` is
    where it was named: `agent.spool_dir`)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{option} {path}: cannot create it: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: this user cannot write in it")
    return path
