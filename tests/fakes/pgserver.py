"""A real PostgreSQL server for the tests, never a mock.

The server is the one the `pgserver` wheel ships (PostgreSQL 16 binaries; a dependency of
the `test` extra, so the README's test command needs nothing but Python), started by hand
here: `initdb` with a password (SCRAM), then `postgres` on a free TCP port of 127.0.0.1,
so tests use the same `postgresql://user:password@host:port/db` form as MEMSUM_DB_URL.
As root the server runs as the `postgres` user, else as a `memsum-pg` system user made
for it (PostgreSQL refuses to run as root). `MEMSUM_TEST_PG_URL` points the tests at a
server of your own instead (its user must be allowed to CREATE DATABASE).

The data directory lives in a temp dir with fsync off: a process kill loses nothing
committed (the WAL is written), only a machine crash could, and the tests kill processes.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit, urlunsplit

from tests.fakes.ports import free_port

USER = "memsum"
PASSWORD = "memsum-test-pw"


def _bin_dir() -> Path:
    # Found, not imported: importing pgserver sets up its own server machinery.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("PostgreSQL tests need the `pgserver` wheel: pip install -e '.[test]'")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _system_user() -> str | None:
    """The account the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "memsum-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "memsum-pg"], check=True, capture_output=True)
    return "memsum-pg"


class PgServer:
    """One private cluster; `database()` hands out a fresh empty database per test."""

    def __init__(self) -> None:
        self.external = os.environ.get("MEMSUM_TEST_PG_URL", "")
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        self.port = 0

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> Self:
        if self.external:
            return self
        bindir = _bin_dir()
        self._dir = Path(tempfile.mkdtemp(prefix="memsum-pg-"))
        self._user = _system_user()
        pwfile = self._dir / "pw"
        pwfile.write_text(PASSWORD)
        if self._user:
            info = pwd.getpwnam(self._user)
            os.chown(self._dir, info.pw_uid, info.pw_gid)
            os.chown(pwfile, info.pw_uid, info.pw_gid)
        data = self._dir / "data"
        self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "--pwfile",
                str(pwfile),
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        pwfile.unlink()
        self.port = free_port()
        log = open(self._dir / "server.log", "ab")
        self._proc = subprocess.Popen(
            self._as_user(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(self._dir),
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=300",
                ]
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._wait_ready()
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()  # SIGTERM: smart shutdown is enough for a throwaway cluster
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- URLs and databases ----------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        if self.external:
            parts = urlsplit(self.external)
            return urlunsplit(parts._replace(path="/" + database))
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new empty database; its URL."""
        name = "t_" + uuid.uuid4().hex[:16]
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def psql(self, sql: str, database: str = "postgres", *, url: str | None = None) -> str:
        """Run SQL with the server's own psql (no Python driver needed); its output."""
        psql = shutil.which("psql") if self.external else str(_bin_dir() / "psql")
        if not psql:
            raise RuntimeError("MEMSUM_TEST_PG_URL is set but no psql is on PATH")
        target = url or self.url(database)
        out = subprocess.run(
            [psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", target, "-c", sql],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.strip()

    # -- helpers ---------------------------------------------------------------------

    def _as_user(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", self._user, "--", *cmd] if self._user else cmd

    def _run(self, cmd: list[str]) -> None:
        done = subprocess.run(self._as_user(cmd), capture_output=True, text=True, timeout=120)
        if done.returncode:
            tail = done.stderr.strip()[-2000:]
            raise RuntimeError(f"{Path(cmd[0]).name} failed ({done.returncode}): {tail}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                assert self._dir is not None
                log = (self._dir / "server.log").read_text(errors="replace")
                raise RuntimeError(f"PostgreSQL exited at start ({self._proc.returncode}): {log[-2000:]}")
            try:
                self.psql("SELECT 1")
                return
            except subprocess.CalledProcessError:
                time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not accept connections within 60 s")
