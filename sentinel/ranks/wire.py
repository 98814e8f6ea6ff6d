"""The rank-control wire: versioned JSON lines between `sentinel run` and its warm processes.

Two kinds of process speak it to the supervisor's rank pool (`sentinel.ranks.pool`):

- a **node host** (`sentinel.ranks.host`), one per node of the job and per hot spare, with
  the trainer's modules imported, which forks rank processes on request and reports when one
  ends;
- a **rank process**, forked by its node host, which runs the trainer's `main(argv)` once per
  gang generation, in process, and stays alive between generations.

Every connection opens with a `hello` carrying the job's rank secret (from the environment,
never argv); the pool drops a connection whose first line is anything else. Lines are at most
`MAX_LINE` bytes. Standard library and pydantic only: rank processes import this.
"""

from __future__ import annotations

import socket
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

WIRE_VERSION: Literal[1] = 1
MAX_LINE = 1 << 20
SECRET_ENV = "SENTINEL_RANKS_SECRET"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    v: Literal[1] = WIRE_VERSION


# --- to the pool -------------------------------------------------------------------------------


class Hello(_Message):
    """The first line on every connection. A node host has no slot; a rank process has one."""

    op: Literal["hello"] = "hello"
    secret: str = Field(repr=False)
    node: str = Field(min_length=1, max_length=128)
    pid: int = Field(gt=0)
    slot: int | None = Field(default=None, ge=0)


class Exited(_Message):
    """From a node host: the rank process it forked for `slot` ended with `code` (-N: by
    signal N)."""

    op: Literal["exited"] = "exited"
    slot: int = Field(ge=0)
    pid: int = Field(gt=0)
    code: int


class Ended(_Message):
    """From a rank process: its trainer's `main` for `generation` returned `code`. `left`: it
    left because the pool asked (`Leave`); `error`: the exception that ended it, if one did;
    `peer_lost`: that exception came from a link to a peer that ended (the peer's failure, as
    far as this rank can tell)."""

    op: Literal["ended"] = "ended"
    generation: int = Field(ge=0)
    code: int
    left: bool = False
    error: str | None = None
    peer_lost: bool = False


# --- from the pool -----------------------------------------------------------------------------


class Spawn(_Message):
    """To a node host: fork a rank process for `slot` (a GPU of the node)."""

    op: Literal["spawn"] = "spawn"
    slot: int = Field(ge=0)


class Kill(_Message):
    """To a node host: end the rank process of `slot` now (SIGKILL), and report `Exited`."""

    op: Literal["kill"] = "kill"
    slot: int = Field(ge=0)


class Run(_Message):
    """To a rank process: run `argv` (the trainer's arguments after `-m MODULE`) as `rank` of
    `generation`, with `env` (the torchrun variables and the job's own) and output in `log`."""

    op: Literal["run"] = "run"
    generation: int = Field(ge=0)
    rank: int = Field(ge=0)
    module: str
    argv: list[str]
    env: dict[str, str]
    log: str | None = None


class Leave(_Message):
    """To a rank process: leave `generation` at the next step boundary (the trainer sees it
    through `sentinel.ranks.current.leave_requested()`). `at_once`: the generation is broken
    (a peer died, or the gang did not reach a step boundary in time): cut its connections so
    that a collective waiting on a peer fails now instead of at its timeout."""

    op: Literal["leave"] = "leave"
    generation: int = Field(ge=0)
    at_once: bool = False


class Exit(_Message):
    """To a node host or a rank process: end (the job is over, or its node left the job)."""

    op: Literal["exit"] = "exit"


ToPool = Annotated[Hello | Exited | Ended, Field(discriminator="op")]
FromPool = Annotated[Spawn | Kill | Run | Leave | Exit, Field(discriminator="op")]
_TO_POOL: TypeAdapter[Hello | Exited | Ended] = TypeAdapter(ToPool)
_FROM_POOL: TypeAdapter[Spawn | Kill | Run | Leave | Exit] = TypeAdapter(FromPool)


class WireError(ValueError):
    """A line that is not a message of this wire."""


def encode(message: _Message) -> bytes:
    return message.model_dump_json().encode() + b"\n"


def _decode(adapter: TypeAdapter[Any], line: bytes) -> Any:
    try:
        return adapter.validate_json(line)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "message"
        raise WireError(f"{where}: {first['msg']}") from None


def decode_to_pool(line: bytes) -> Hello | Exited | Ended:
    message: Hello | Exited | Ended = _decode(_TO_POOL, line)
    return message


def decode_from_pool(line: bytes) -> Spawn | Kill | Run | Leave | Exit:
    message: Spawn | Kill | Run | Leave | Exit = _decode(_FROM_POOL, line)
    return message


class LineReader:
    """Newline-framed reading from a socket: `feed` what arrived, take whole lines."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines = []
        while (end := self._buf.find(b"\n")) >= 0:
            lines.append(bytes(self._buf[:end]))
            del self._buf[: end + 1]
        if len(self._buf) > MAX_LINE:
            raise WireError(f"a line longer than {MAX_LINE} bytes")
        return lines


def connect(address: str, timeout_s: float = 30.0) -> socket.socket:
    """A connection to the pool at `HOST:PORT`."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_lines(sock: socket.socket, reader: LineReader) -> list[bytes] | None:
    """The next whole lines from a blocking socket; None once the peer closed it."""
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        lines = reader.feed(data)
        if lines:
            return lines
