"""The complete bot: NoneBot2 + OneBot v11 (reverse WebSocket) + this plugin.

Run from the folder that holds `.env` (copy `.env.example`): `python bot.py`. Other
plugins listed under `[tool.nonebot]` of a `pyproject.toml` in that folder (where
`nb plugin install` puts them) are loaded too.
"""

import errno
import functools
import hmac
import io
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import nonebot
import nonebot.adapters.onebot.v11.adapter
import nonebot.adapters.onebot.v11.bot
import nonebot.compat
import nonebot.internal.adapter.message
import nonebot.internal.matcher.matcher
import nonebot.message
from nonebot.adapters.onebot.v11 import Adapter as OneBotV11Adapter
from nonebot.adapters.onebot.v11 import Event as OneBotV11Event
from nonebot.adapters.onebot.v11.config import Config as OneBotV11Config
from nonebot.adapters.onebot.v11.exception import NoLogException
from nonebot.config import SettingsError
from nonebot.drivers import ASGIMixin
from nonebot.log import default_filter, default_format, logger, logger_id
from pydantic import TypeAdapter, ValidationError


class _PerEventLines:
    """NoneBot's logger as its per-event modules (nonebot/message.py, the matcher) see it
    when LOG_LEVEL is above DEBUG. Those log every event with its text (SUCCESS) and every
    matcher run (INFO): at a thousand groups that is most of the log, and what /清除
    removed would live on in it. Their lines below WARNING are not built at all (building
    and then filtering them cost about 5 % of the bot's CPU); warnings and errors go
    through as before, from the caller's file and line."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self._options = options or {}

    def opt(self, **options: Any) -> "_PerEventLines":
        return _PerEventLines(options)

    def _dropped(self, *args: Any, **kwargs: Any) -> None:
        pass

    trace = debug = info = success = _dropped

    def __getattr__(self, level: str) -> Any:  # warning, error, exception, critical, log
        return getattr(logger.opt(depth=1, **self._options), level)


def _no_event_line(self: OneBotV11Event) -> str:
    raise NoLogException  # NoneBot then skips the event's line and its DEBUG lines


_adapter_log = nonebot.adapters.onebot.v11.adapter.log  # pyright: ignore[reportPrivateImportUsage]


def _adapter_log_without_payloads(level: str, message: str, exception: Exception | None = None) -> None:
    """The adapter's log, except that an event it cannot parse at all (a `time` that is no
    number, from a buggy implementation) is not logged with its whole payload at ERROR:
    the message's text would outlive /清除 in the log. What failed is named instead."""
    if "Failed to parse event. Raw:" not in message:
        _adapter_log(level, message, exception)
        return
    try:
        fields = ", ".join(sorted({".".join(map(str, e["loc"])) for e in exception.errors()}))  # type: ignore[union-attr]
    except Exception:
        fields = "?"
    _adapter_log(
        level, f"Failed to parse an event ({type(exception).__name__}: {fields}); its payload is not logged"
    )


def _quiet_per_event_lines() -> None:
    nonebot.message.logger = nonebot.internal.matcher.matcher.logger = _PerEventLines()  # type: ignore[assignment]
    OneBotV11Event.get_log_string = _no_event_line  # the line's text is built before it is logged
    nonebot.adapters.onebot.v11.adapter.log = _adapter_log_without_payloads  # pyright: ignore[reportPrivateImportUsage]


# NoneBot validates every segment of every message through a TypeAdapter it builds anew
# for each (nonebot/compat.py `type_validate_python`, still so upstream in nonebot/nonebot2
# main); building one costs about 40 times using it (pydantic's performance guide,
# "TypeAdapter instantiated once"). The types are the adapter's few classes: a small cache.
_type_adapter = functools.lru_cache(maxsize=64)(TypeAdapter)


def _type_validate_python(type_: Any, data: Any) -> Any:
    return _type_adapter(type_).validate_python(data)


for _module in (
    nonebot.compat,
    nonebot.internal.adapter.message,
    nonebot.adapters.onebot.v11.adapter,
    nonebot.adapters.onebot.v11.bot,
):
    _module.type_validate_python = _type_validate_python  # type: ignore[attr-defined]


# A secret written in a URL's query: owners paste `…/onebot/v11/ws?access_token=…` (OneBot
# v11 allows the token as a query parameter), an API's `?key=…`. uvicorn logs every WebSocket
# handshake and HTTP request with its query at INFO, NoneBot a forward URL it cannot reach.
_QUERY_SECRET = re.compile(
    r"([?&](?:access_token|token|key|api_key|apikey|secret|password)=)[^&#\s\"']+", re.IGNORECASE
)


def _log_filter(record: Any) -> bool:
    message = record["message"]
    if "=" in message and ("?" in message or "&" in message):
        record["message"] = _QUERY_SECRET.sub(r"\1***", message)
    # The plugin refused to start and said why in one line (a database it cannot use):
    # uvicorn's copy of the stack down to that refusal tells an owner nothing more.
    if record["name"].startswith("uvicorn") and record["message"].rstrip().endswith("StartUpRefused: 2"):
        return False
    try:
        return default_filter(record)
    except ValueError:
        # LOG_LEVEL=info, before _log_level() has read it: INFO, never DEBUG (NoneBot's
        # DEBUG line of the loaded config holds every .env value, API keys too).
        return record["level"].no >= logger.level("INFO").no


def _log_to_stdout(level: int | str) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A console or log file that is not UTF-8 (Windows' code page 936, a C locale): a
        # character it lacks (a member's emoji, a start-up line in Chinese) cost the whole
        # line and printed a stack in its place; written as \U0001f602 instead.
        sys.stdout.reconfigure(errors="backslashreplace")
    return logger.add(sys.stdout, level=level, diagnose=False, filter=_log_filter, format=default_format)


# NoneBot's own keys owners edit (most hold a JSON list): the form to show one who wrote it wrong.
_FORMS = {
    "driver": "DRIVER=~fastapi (or ~fastapi+~websockets, ~fastapi+~httpx: README 其他连接方式)",
    "superusers": 'SUPERUSERS=["10001", "10002"] (QQ numbers in double quotes)',
    "nickname": 'NICKNAME=["小记"]',
    "command_start": 'COMMAND_START=["/"]',
    "command_sep": 'COMMAND_SEP=["."]',
}


def _init_refused(err: Exception) -> str:
    """One line naming the `.env` key NoneBot's own settings refused (SUPERUSERS written
    `[10001]`, a list with a full-width comma, a PORT that is no number, a DRIVER it cannot
    import) instead of the stack: never a setting's value (R-CFG-1), only DRIVER's."""
    if isinstance(err, UnicodeDecodeError):
        return _not_utf8(err)
    if isinstance(err, SettingsError):
        found = re.search(r'env var "([^"]+)"', str(err))
        key = found.group(1) if found else "?"
        why = f"the value is not valid JSON ({err.__cause__})" if err.__cause__ else str(err)
    elif isinstance(err, ValidationError):
        first = err.errors(include_url=False)[0]
        key = str(first["loc"][0]) if first["loc"] else "?"
        why = first["msg"] + "".join(f" (item {p})" for p in first["loc"][1:2])
    else:
        # NoneBot resolving DRIVER (its only step after the settings): `fastapi` without the
        # `~`, a space for the `+`, a driver whose package is not installed.
        key, why = "DRIVER", f"{type(err).__name__}: {err}"
    example = _FORMS.get(key.lower())
    hint = f"; write it like {example}" if example else ""
    return f"bot.py: invalid {key.upper()} in .env: {why}{hint}"


def _not_utf8(err: UnicodeDecodeError) -> str:
    """NoneBot reads `.env` (and `.env.prod`, …) as UTF-8: one saved as Notepad's "ANSI"
    (GBK on a Chinese Windows) or "Unicode" (UTF-16) is named with its first bad line."""
    for path in sorted(Path().glob(".env*")):
        data = path.read_bytes() if path.is_file() and path.name != ".env.example" else b""
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            line = data[: bad.start].count(b"\n") + 1
            return (
                f"bot.py: {path.name} is not saved as UTF-8 (line {line}); save it again with the"
                " encoding UTF-8 (记事本：另存为 → 编码选 UTF-8)"
            )
    return f"bot.py: a .env file is not saved as UTF-8 ({err.reason}); save it again with the encoding UTF-8"


logger.remove(logger_id)
_handler = _log_to_stdout(0)  # until nonebot.init() has read LOG_LEVEL
if not Path(".env").is_file():
    # Started from another folder than the one holding .env (or before copying
    # .env.example): NoneBot would run on its defaults without a word.
    logger.warning(
        f"bot.py: no .env in {Path.cwd()}: NoneBot's defaults apply, and no MEMSUM_ key (NoneBot"
        " reads a plugin's keys only from .env); copy .env.example to .env there and fill in the"
        " model, SUPERUSERS and ONEBOT_ACCESS_TOKEN, or start bot.py from the folder holding your .env"
    )
try:
    nonebot.init()
except (ValueError, ImportError, AttributeError) as refused:  # SettingsError, ValidationError too
    logger.opt(colors=False).critical(_init_refused(refused))
    sys.exit(2)
# At the configured level, not 0: below every handler's level loguru returns before it
# builds a record, and NoneBot's debug and trace lines for each event and matcher cost
# about 5 % of the bot's CPU at a thousand groups when only the filter dropped them.


def _log_level() -> int | str:
    """LOG_LEVEL as loguru names it: `info` (loguru's names are upper case, and NoneBot's
    filter raised on every line) is INFO; a name loguru lacks stops start-up in one line."""
    config = nonebot.get_driver().config
    if not isinstance(config.log_level, str):
        return config.log_level
    named = config.log_level.strip().upper()
    try:
        logger.level(named)
    except ValueError:
        logger.opt(colors=False).critical(
            f"bot.py: invalid LOG_LEVEL in .env: no level {config.log_level!r};"
            " use DEBUG, INFO, WARNING or ERROR (or a number)"
        )
        sys.exit(2)
    config.log_level = named
    logger.configure(extra={"nonebot_log_level": named})
    return named


def _warn_open_without_token() -> None:
    """Without ONEBOT_ACCESS_TOKEN anyone who reaches the port can connect as the QQ account
    and send messages as SUPERUSERS: fine on 127.0.0.1, not on an address others reach."""
    config = nonebot.get_driver().config
    token = getattr(config, "onebot_access_token", None)
    if not (isinstance(token, str) and token.strip()) and not config.host.is_loopback:
        logger.warning(
            f"bot.py: ONEBOT_ACCESS_TOKEN is empty and HOST={config.host}: anyone who reaches"
            f" port {config.port} can connect as your QQ account and send commands as an owner;"
            " set ONEBOT_ACCESS_TOKEN (and the same token in NapCat / Lagrange)"
        )


_EVENT_PATHS = frozenset({"/onebot/v11", "/onebot/v11/http"})
"""Where nonebot-adapter-onebot takes events POSTed over HTTP (v11/adapter.py `_setup`)."""


class _SignedEventsOnly:
    """The OneBot adapter mounts its HTTP event route whatever the mode and checks only
    ONEBOT_SECRET's signature there, never ONEBOT_ACCESS_TOKEN; an event POSTed with an
    account's X-Self-ID is handled by that account's connected bot. With a token and no
    secret, anyone who reaches the port could post a message "from" a SUPERUSER and run
    the owner's commands, past the token that guards the WebSocket. Such a POST must carry
    the token (`Authorization: Bearer …`); an implementation that posts events (HTTP mode)
    signs them instead, with ONEBOT_SECRET set to its key. ASGI, so WebSockets and the
    other routes pass untouched."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._bearer = f"Bearer {token}".encode()
        self._told = -60.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and _route_path(scope).rstrip("/") in _EVENT_PATHS
        ):
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(auth, self._bearer):
                if time.monotonic() - self._told >= 60:  # one line a minute, however many come
                    self._told = time.monotonic()
                    logger.warning(
                        f"bot.py: refused an event POSTed to {scope['path']}: ONEBOT_ACCESS_TOKEN is set and"
                        " ONEBOT_SECRET is not, so an event over HTTP must carry the token; if your OneBot"
                        " implementation posts events over HTTP, set ONEBOT_SECRET to the key it signs with"
                    )
                body = b"events over HTTP need ONEBOT_SECRET's signature or the access token\n"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _route_path(scope: dict[str, Any]) -> str:
    """The path the app's routes match, as Starlette's router takes it: without FastAPI's
    `root_path` (FASTAPI_EXTRA, behind a reverse proxy) when the path starts with it."""
    path, root = str(scope["path"]), str(scope.get("root_path") or "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


def _where_to_connect() -> None:
    """The address README 快速开始 has owners give NapCat: uvicorn's own line names only
    http://host:port, which an implementation's reverse WebSocket does not connect to."""
    driver = nonebot.get_driver()
    if not isinstance(driver, ASGIMixin):
        return  # no server: forward WebSocket or HTTP only
    url = page_url(str(driver.config.host), driver.config.port, "/onebot/v11/ws", "ws")
    token = (nonebot.get_plugin_config(OneBotV11Config).onebot_access_token or "").strip()
    logger.info(
        f"bot.py: point the OneBot implementation's reverse WebSocket (NapCat, Lagrange, LLOneBot) at {url}"
        + (
            "; token: the one in ONEBOT_ACCESS_TOKEN"
            if token
            else "; no token (none set in ONEBOT_ACCESS_TOKEN)"
        )
    )


def _refuse_a_taken_address() -> None:
    """HOST:PORT already taken (another program, a second bot.py): one line naming the `.env`
    keys, before the start-up opens anything; uvicorn said only `[Errno 98] error while
    attempting to bind`, after it. Probed as uvicorn binds (asyncio's SO_REUSEADDR on POSIX:
    the closed connections of a bot.py just stopped do not count; on Windows the option
    would let the probe share a port in use, and asyncio does not set it there)."""
    driver = nonebot.get_driver()
    if not isinstance(driver, ASGIMixin):
        return  # no server: forward WebSocket or HTTP only
    host, port = driver.config.host, driver.config.port
    address = f"[{host}]:{port}" if host.version == 6 else f"{host}:{port}"
    with socket.socket(socket.AF_INET6 if host.version == 6 else socket.AF_INET) as probe:
        if os.name == "posix":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((str(host), port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", errno.EADDRINUSE)):
                why = f"地址 {address} 已被占用（别的程序或另一个 bot.py 在用）"
            else:
                why = f"无法在 {address} 上监听（{err.strerror}）"
            logger.opt(colors=False).critical(
                f"bot.py: {why}；在 .env 里把 PORT 改成别的端口（或用 HOST 换个地址），"
                "OneBot 实现（NapCat 等）的反向 WebSocket 地址也跟着改"
            )
            sys.exit(2)


def _guard_http_events() -> None:
    onebot = nonebot.get_plugin_config(OneBotV11Config)
    token = (onebot.onebot_access_token or "").strip()
    driver = nonebot.get_driver()
    if token and not onebot.onebot_secret and isinstance(driver, ASGIMixin):
        driver.server_app.add_middleware(_SignedEventsOnly, token=onebot.onebot_access_token)


level = _log_level()
logger.remove(_handler)
_log_to_stdout(level)
_refuse_a_taken_address()
_warn_open_without_token()
_guard_http_events()
if (logger.level(level).no if isinstance(level, str) else level) > logger.level("DEBUG").no:
    _quiet_per_event_lines()
nonebot.get_driver().register_adapter(OneBotV11Adapter)
project = Path("pyproject.toml")
if project.is_file() and "[tool.nonebot" in project.read_text("utf-8"):
    sys.path.insert(0, str(Path.cwd()))  # its plugin_dirs are folders of this one
    nonebot.load_from_toml(str(project))
if nonebot.get_plugin("nonebot_plugin_memsum") is None:
    nonebot.load_plugin("nonebot_plugin_memsum")

from nonebot_plugin_memsum.gcpolicy import GcPolicy  # once loaded as a plugin, not before
from nonebot_plugin_memsum.web import page_url

_where_to_connect()

_gc_policy = GcPolicy()


# Registered after every plugin's: runs once their start-up (the store, the tokenizer) is done.
@nonebot.get_driver().on_startup
async def _freeze_start_up() -> None:
    logger.info(f"memsum: {_gc_policy.start()} objects left by start-up frozen (gcpolicy.py)")


if __name__ == "__main__":
    nonebot.run()
