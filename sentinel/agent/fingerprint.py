"""The node's configuration fingerprint (sentinel/fingerprint.py), reported to the coordinator as
`agent.fingerprint` events: at start, when it changes, and every `agent.fingerprint_every_s`
whatever (the coordinator prunes events past its retention; the node's latest must outlive it).

Two halves, read together and neither on the event loop's time: what NVML says (the backend's
`fingerprint()`, on the sweep thread like every NVML call, so between sweeps and under the call
deadline) and the job's runtime. The agent does not import torch, and its own environment is
not the ranks', so the runtime comes from a probe: `agent.job_python -m sentinel.fingerprint`,
run without a shell, with `agent.job_env_file`'s variables, for at most 30 s. A probe that fails
leaves its fields out and is logged once until it answers again; the agent goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import re
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from sentinel.fingerprint import ENV_PREFIXES, checked
from sentinel.protocol import AgentFingerprintEvent, AgentFingerprintPayload, Event, Source

log = logging.getLogger("sentinel.agent")

PROBE_TIMEOUT_S = 30.0
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MASKED_FROM = 4  # values this long or longer are masked in a probe's error (shorter: 0, 1, on)


class ProbeFailed(Exception):
    """The job's runtime could not be read; the message never holds a value of the env file."""


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them: blank lines and lines starting
    with `#` or `;` skipped, whitespace around the name and value dropped, a value in single or
    double quotes taken without them. A line that is not KEY=VALUE is skipped and logged by its
    number only (the file may hold secrets). Raises OSError, UnicodeDecodeError."""
    found: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _NAME.fullmatch(name):
            log.warning("agent.job_env_file %s line %d: not KEY=VALUE, skipped", path, number)
            continue
        quote = value[:1]
        if len(value) >= 2 and quote in ("'", '"') and value.endswith(quote):
            value = value[1:-1]
            if quote == '"':  # backslash escapes, as systemd reads them inside "..."
                value = re.sub(r"\\(.)", r"\1", value)
        found[name] = value
    return found


def _masked(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        if len(value) >= _MASKED_FROM:
            text = text.replace(value, "***")
    return text


async def probe_runtime(
    python: str, env_file: Path | None, timeout_s: float = PROBE_TIMEOUT_S
) -> dict[str, str]:
    """The runtime fields of the job's environment (`sentinel.fingerprint.runtime_fields`, run
    by `python`). Its environment is the agent's without the agent's own NCCL_* and FI_*
    variables (the ranks' are not the agent's), plus `env_file`'s. Raises ProbeFailed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
    given: dict[str, str] = {}
    if env_file is not None:
        try:
            given = read_env_file(env_file)
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise ProbeFailed(f"agent.job_env_file {env_file}: {why}") from None
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "sentinel.fingerprint",
            env=env | given,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        raise ProbeFailed(f"cannot run agent.job_python {python}: {e.strerror or e}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        raise ProbeFailed(f"{python} -m sentinel.fingerprint ran past {timeout_s:g} s") from None
    finally:
        if proc.returncode is None:  # timed out, or the agent is stopping
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        said = _masked(last, given.values())[:300]
        raise ProbeFailed(f"{python} -m sentinel.fingerprint: exit code {proc.returncode}: {said}")
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise ProbeFailed(f"{python} -m sentinel.fingerprint printed no fingerprint")
    return checked(doc)


class FingerprintReporter:
    """Reads the fingerprint and emits it: at start, when it changed since the last one sent
    (a `wake()` reads it at once: SIGHUP), and every `every_s` whether it changed or not."""

    def __init__(
        self,
        source: Source,
        read_nvml: Callable[[], Awaitable[dict[str, str]]],
        emit: Callable[[list[Event]], None],
        *,
        every_s: float,
        job_python: str | None = None,
        job_env_file: Path | None = None,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.source = source
        self._read_nvml = read_nvml
        self._emit = emit
        self.every_s = every_s
        self.job_python = job_python
        self.job_env_file = job_env_file
        self.probe_timeout_s = probe_timeout_s
        self.sent: dict[str, str] | None = None
        self._wake = asyncio.Event()
        self._nvml_failing = False
        self._probe_failing = False

    def wake(self) -> None:
        self._wake.set()

    async def read(self) -> dict[str, str]:
        nvml, runtime = await asyncio.gather(self._nvml(), self._runtime())
        return checked(nvml | runtime)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due, due_at = True, loop.time()
        while True:
            fields = await self.read()
            if due or fields != self.sent:
                payload = AgentFingerprintPayload(fields=fields)
                self._emit([AgentFingerprintEvent(source=self.source, payload=payload)])
                self.sent, due_at = fields, loop.time() + self.every_s
            # Woken (SIGHUP): read again and send only what changed; the resend stays due at
            # its time, however often the agent is woken before it.
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, due_at - loop.time()))
                due = False
            except TimeoutError:
                due = True
            self._wake.clear()

    async def _nvml(self) -> dict[str, str]:
        try:
            fields = await self._read_nvml()
        except Exception:
            if not self._nvml_failing:  # the traceback once, not every read
                log.exception("reading the NVML fingerprint failed; its fields are left out")
            self._nvml_failing = True
            return {}
        self._nvml_failing = False
        return fields

    async def _runtime(self) -> dict[str, str]:
        # The kernel is the host's: the agent's own answer is the ranks' too.
        fields = {"kernel": platform.release()}
        if self.job_python is None:
            return fields
        try:
            fields |= await probe_runtime(self.job_python, self.job_env_file, self.probe_timeout_s)
        except ProbeFailed as e:
            if not self._probe_failing:
                log.warning("the job's runtime is left out of the fingerprint: %s", e)
            self._probe_failing = True
            return fields
        if self._probe_failing:
            log.info("the job's runtime is in the fingerprint again")
        self._probe_failing = False
        return fields
