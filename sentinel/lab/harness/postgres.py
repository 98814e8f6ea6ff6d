"""A real, throwaway PostgreSQL server for tests, drills and benchmarks.

`initdb` into a temporary directory (as the `postgres` system user when run as root: the
server refuses to run as root), `pg_ctl start` on a free loopback port with its Unix socket in a
private directory, a `sentinel` role with a random password and a `sentinel` database. The
password is written to a mode-0600 file and given to clients through `PGPASSFILE`, never on a
command line. `stop()` stops the server and removes the directory: nothing is left behind.
Drills get `kill()` (SIGKILL of the postmaster, as a crash) and `restart()`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sentinel.processes import free_port

SERVICE_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries (or a user to run them as) are not on this machine."""


def find_bindir() -> Path:
    """The directory holding `initdb` and `pg_ctl`: Debian's versioned one, else PATH."""
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if debian:
        return debian[0].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl): install them with "
        "`apt-get install postgresql`"
    )


class ThrowawayPostgres:
    def __init__(self, root: Path | None = None, port: int | None = None) -> None:
        """`root`: where the server's directory goes (default: the system's temporary
        directory); run as root, the `postgres` user must be able to reach it."""
        self.bindir = find_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="sentinel-pg-", dir=root))
        self.data, self.sockets = self.root / "data", self.root / "sockets"
        self.port = port or free_port()
        self.password_file = self.root / "pgpass"
        self._as_user = SERVICE_USER if os.geteuid() == 0 else None
        self._password = secrets.token_urlsafe(24)
        self._initialised = False

    # --- what clients use ------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """A connection URL without the password (it comes from `PGPASSFILE`)."""
        return f"postgresql://sentinel@127.0.0.1:{self.port}/sentinel"

    def client_env(self) -> dict[str, str]:
        return {"PGPASSFILE": str(self.password_file)}

    # --- life cycle --------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        if not self._initialised:
            self._initdb()
        self._pg_ctl(
            "start",
            "-w",
            "-t",
            str(int(timeout_s)),
            "-l",
            str(self.root / "server.log"),
            "-o",
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200",
        )
        if not self._initialised:
            self._create_role()
            self._initialised = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: roll back open transactions, disconnect clients)."""
        if self._running():
            self._pg_ctl("stop", "-w", "-m", mode)

    def restart(self, timeout_s: float = 60.0) -> None:
        self.stop()
        self.start(timeout_s)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash; `start()` recovers from the WAL."""
        pid = self.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self._alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def close(self) -> None:
        """Stop the server and remove everything it wrote."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------------------

    def _run(self, *argv: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if self._as_user is not None:
            cmd = ["runuser", "-u", self._as_user, "--", *cmd]
        done = subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(
                f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done

    def _initdb(self) -> None:
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self._as_user is not None:
            shutil.chown(self.root, self._as_user)
            shutil.chown(self.sockets, self._as_user)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        hba = self.data / "pg_hba.conf"
        # Local superuser over the private socket (its directory is the server user's only);
        # every TCP client authenticates with a password.
        hba.write_text("local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        self.password_file.write_text(f"127.0.0.1:{self.port}:*:sentinel:{self._password}\n")
        os.chmod(self.password_file, 0o600)

    def _create_role(self) -> None:
        sql = (
            f"CREATE ROLE sentinel LOGIN PASSWORD '{self._password}';\n"
            "CREATE DATABASE sentinel OWNER sentinel;\n"
        )
        psql = self.bindir / "psql" if (self.bindir / "psql").exists() else Path("psql")
        self._run(
            str(psql),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(self.sockets),
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-f",
            "-",
            input_text=sql,
        )

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), *args)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _running(self) -> bool:
        pid = self.postmaster_pid()
        return pid is not None and self._alive(pid)
