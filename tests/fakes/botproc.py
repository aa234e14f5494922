"""`bot.py` as a real subprocess, in a folder of its own, for end-to-end tests.

Each BotProcess owns a work folder holding its `.env`, its log and every file the bot
writes (SQLite, localstore dirs, even HOME), so a test never touches the real home.
Every process started here is killed at interpreter exit if a test forgot to stop it.
"""

# The harness API takes plain `timeout=` seconds, as the tests read better that way.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Self

from tests.fakes.ports import free_port

REPO = Path(__file__).resolve().parents[2]
BOT_PY = REPO / "bot.py"
# Environment variables the child may inherit; everything else (a stray HOST, PORT,
# ENVIRONMENT or MEMSUM_* of the developer's shell) would override our `.env`.
_INHERITED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SYSTEMROOT", "PYTHONPATH")
_live: dict[int, asyncio.subprocess.Process] = {}


@atexit.register
def _kill_leftovers() -> None:
    for pid in list(_live):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class BotExitedError(Exception):
    """bot.py ended while we waited for it to listen."""

    def __init__(self, returncode: int, log: str) -> None:
        tail = "\n".join(log.splitlines()[-40:])
        super().__init__(f"bot.py exited with {returncode}; log tail:\n{tail}")
        self.returncode = returncode
        self.log = log


def _dotenv_value(value: str) -> str:
    # python-dotenv (NoneBot's reader) keeps single-quoted values literally.
    if "'" not in value and "\n" not in value:
        return f"'{value}'"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


class BotProcess:
    """bot.py as a real subprocess with its own temporary folder, .env and data dir."""

    def __init__(
        self,
        workdir: Path,
        *,
        env: Mapping[str, str] | None = None,
        superusers: tuple[str, ...] = ("10001",),
        nickname: tuple[str, ...] = ("小记",),
        access_token: str | None = "test-token",
        log_level: str = "DEBUG",
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.ws_url = f"ws://127.0.0.1:{self.port}/onebot/v11/ws"
        self.db_path = workdir / "memsum.db"
        self.access_token = access_token
        base = {
            "DRIVER": "~fastapi",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "LOG_LEVEL": log_level,
            "SUPERUSERS": json.dumps(list(superusers)),
            "NICKNAME": json.dumps(list(nickname), ensure_ascii=False),
            "COMMAND_START": json.dumps(["/"]),
            "MEMSUM_DB_PATH": str(self.db_path),
            "LOCALSTORE_CACHE_DIR": str(workdir / "localstore" / "cache"),
            "LOCALSTORE_CONFIG_DIR": str(workdir / "localstore" / "config"),
            "LOCALSTORE_DATA_DIR": str(workdir / "localstore" / "data"),
        }
        if access_token is not None:
            base["ONEBOT_ACCESS_TOKEN"] = access_token
        self.env: dict[str, str] = {**base, **(env or {})}
        """What `.env` will hold; change it before `start` or `restart`."""
        self.wrapper: tuple[str, ...] = ()
        """A command bot.py runs under (`setpriv …`), set before `start`."""
        self.preexec: Callable[[], None] | None = None
        """Run in the child before bot.py starts (resource limits), set before `start`."""
        self.returncode: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log_file: IO[bytes] | None = None
        self._log_start = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "bot.log"

    def log(self, *, all_runs: bool = False) -> str:
        """What the bot printed in its current (or last) run; every run with `all_runs`."""
        if not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[0 if all_runs else self._log_start :].decode("utf-8", errors="replace")

    def _write_dotenv(self) -> None:
        lines = [f"{key}={_dotenv_value(value)}" for key, value in self.env.items()]
        (self.workdir / ".env").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _child_env(self) -> dict[str, str]:
        home = self.workdir / "home"
        env = {key: os.environ[key] for key in _INHERITED if key in os.environ}
        env.update(
            HOME=str(home),
            XDG_DATA_HOME=str(home / ".local" / "share"),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_CACHE_HOME=str(home / ".cache"),
            PYTHONUNBUFFERED="1",
            PYTHONIOENCODING="utf-8",
        )
        return env

    async def spawn(self) -> None:
        """Start bot.py without waiting for it to listen."""
        if self._proc is not None and self._proc.returncode is None:
            raise RuntimeError("bot.py is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "home").mkdir(exist_ok=True)
        self._write_dotenv()
        self._close_log()
        self._log_file = self.log_path.open("ab")
        self._log_start = self._log_file.tell()
        self.returncode = None
        self._proc = await asyncio.create_subprocess_exec(
            *self.wrapper,
            sys.executable,
            str(BOT_PY),
            cwd=self.workdir,
            env=self._child_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=self.preexec,
        )
        _live[self._proc.pid] = self._proc

    async def start(self, timeout: float = 30) -> None:
        """Start bot.py and wait until its port accepts connections."""
        await self.spawn()
        proc = self._proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if proc.returncode is not None:
                raise BotExitedError(await self._reap(), self.log())
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if loop.time() >= deadline:
                    await self.stop()
                    raise TimeoutError(
                        f"bot.py did not listen within {timeout}s; log:\n{self.log()}"
                    ) from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    async def wait_exit(self, timeout: float = 30) -> int:
        """Wait for bot.py to end by itself; its exit code."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("bot.py was never started")
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"bot.py still running after {timeout}s; log:\n{self.log()}") from None
        return await self._reap()

    async def stop(self, timeout: float = 15) -> int:
        """SIGINT (as Ctrl-C would), then SIGKILL after `timeout`; the exit code. Idempotent."""
        proc = self._proc
        if proc is None:
            return self.returncode if self.returncode is not None else 0
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        return await self._reap()

    async def kill(self) -> int:
        """SIGKILL at once, as a crash would; the exit code."""
        proc = self._proc
        if proc is None:
            return self.returncode if self.returncode is not None else 0
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return await self._reap()

    async def terminate(self, timeout: float = 30) -> int:
        """SIGTERM (as a service manager stops it) and wait; the exit code."""
        proc = self._proc
        if proc is None:
            return self.returncode if self.returncode is not None else 0
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), timeout)
        return await self._reap()

    async def restart(self, timeout: float = 30) -> None:
        """Stop and start again on the same folder, port and data."""
        await self.stop()
        await self.start(timeout)

    async def _reap(self) -> int:
        proc = self._proc
        assert proc is not None
        self.returncode = await proc.wait()
        _live.pop(proc.pid, None)
        self._proc = None
        self._close_log()
        return self.returncode

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
