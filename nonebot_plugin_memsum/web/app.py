"""The web page's HTTP face: a FastAPI app NoneBot's own server mounts at /memsum/.

It reads through the same store and services as the chat commands and changes settings
through the same `Settings`, so the page and the commands never disagree. Every /api/
route but sign-in needs the session cookie; every change also needs the CSRF header and,
when the browser names one, an Origin of this host.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from nonebot.log import logger
from pydantic import BaseModel

from nonebot_plugin_memsum import clock, usage
from nonebot_plugin_memsum.agent import recall
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.commands import receipt
from nonebot_plugin_memsum.compression.request import CompressionError
from nonebot_plugin_memsum.compression.service import BACKOFF_NAMESPACE, USAGE_NAMESPACE, conversation_end
from nonebot_plugin_memsum.compression.trigger import Backoff
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.lru import LRU
from nonebot_plugin_memsum.runtime import Runtime, persona_refusal
from nonebot_plugin_memsum.settings import MODE_WORDS, RESET_WORD, SETTING_NAMES
from nonebot_plugin_memsum.store import SearchQuery
from nonebot_plugin_memsum.types import DailyUsage, SessionRecord

from . import views
from .auth import SESSION_SECONDS, Auth, WebSession, same_origin, same_token

COOKIE = "memsum_session"
CSRF_HEADER = "X-Memsum-CSRF"
CROSS_SITE = (
    "拒绝跨站请求（经反向代理访问时，请让代理转发浏览器的 Host 头，"
    "如 nginx 的 proxy_set_header Host $http_host;）"
)
"""The page itself sees it only when a proxy hides the browser's host and the browser sends
no `Sec-Fetch-Site` (plain http to a LAN address): then the fix is the proxy's."""
SEARCH_LIMIT = 20
RECENT = 30
"""The newest conversation messages a session's page shows."""
SEARCH_CONTEXT = 2
"""Messages shown either side of each search hit."""
CHAT_PURPOSE = "对话"
"""The ledger purpose of the agent's chat calls (agent/turn.py): their prompt size is the usage."""
STATIC = Path(str(files("nonebot_plugin_memsum") / "web" / "static"))
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Names = Callable[[], Awaitable[Mapping[str, str]]]
"""Display names of places: `group:<n>` → group name, `private:<n>` → nickname."""


async def no_names() -> Mapping[str, str]:
    return {}


class SignIn(BaseModel):
    token: str


class SettingChange(BaseModel):
    name: str
    scope: Literal["session", "place"] = "session"
    value: float | int | str | None = None
    """None: back to the layer below."""


class ClearRequest(BaseModel):
    kind: Literal["context", "summary"]
    confirm: bool = False
    """Clearing the context needs it: the page asks first."""


def create_app(get_runtime: Callable[[], Runtime], token: str, names: Names = no_names) -> FastAPI:
    """The page and its API; mount it with `server_app.mount("/memsum", app)`."""
    auth = Auth(token)
    live = _Live()
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    # The overview of a thousand groups is 0.7 MB of JSON, polled every few seconds (a phone's
    # data). No answer holds both a secret (the CSRF token) and chat text: nothing for BREACH.
    app.add_middleware(GZipMiddleware, minimum_size=1024)

    @app.middleware("http")
    async def _headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        for key, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    def signed_in(request: Request) -> WebSession:
        session = auth.session(request.cookies.get(COOKIE))
        if session is None:
            raise HTTPException(401, "请先登录")
        return session

    def change_allowed(request: Request, session: WebSession = Depends(signed_in)) -> WebSession:
        """Every change: the CSRF token the page got at sign-in, and no foreign Origin."""
        if not _from_the_page(request):
            raise HTTPException(403, CROSS_SITE)
        given = request.headers.get(CSRF_HEADER, "")
        if not given or not same_token(given, session.csrf):
            raise HTTPException(403, "缺少或错误的 CSRF 令牌，请刷新页面")
        return session

    api = APIRouter(prefix="/api")
    read = APIRouter(dependencies=[Depends(signed_in)])
    change = APIRouter(dependencies=[Depends(change_allowed)])

    @api.post("/login")
    async def login(body: SignIn, request: Request) -> Response:
        if not _from_the_page(request):
            raise HTTPException(403, CROSS_SITE)
        address = request.client.host if request.client else "?"
        wait = auth.retry_after(address)
        if wait > 0:
            return JSONResponse(
                {"detail": f"尝试次数过多，请 {int(wait) + 1} 秒后再试"},
                status_code=429,
                headers={"Retry-After": str(int(wait) + 1)},
            )
        signed = auth.sign_in(address, body.token)
        if signed is None:
            logger.warning(f"memsum: web sign-in with a wrong token from {address}")
            raise HTTPException(401, "令牌不对")
        sid, session = signed
        response = JSONResponse({"csrf": session.csrf})
        _session_cookie(response, request, sid, SESSION_SECONDS)
        return response

    @api.post("/logout")
    async def logout(request: Request, _: WebSession = Depends(change_allowed)) -> Response:
        auth.sign_out(request.cookies.get(COOKIE))
        response = JSONResponse({"ok": True})
        _session_cookie(response, request, "", 0)
        return response

    @read.get("/me")
    async def me(session: WebSession = Depends(signed_in)) -> dict[str, Any]:
        return {"csrf": session.csrf}

    @read.get("/overview")
    async def overview() -> dict[str, Any]:
        rt = get_runtime()
        await rt.compression.write_usage()  # the latest usages still waiting to be written
        measured = await rt.store.meta_values(USAGE_NAMESPACE)
        activity, last, stored, today, place_names, backoffs = await asyncio.gather(
            rt.store.session_overview(CHAT_PURPOSE),
            rt.store.last_compressions(),
            rt.store.all_settings(),
            _by_day(rt, _midnight(rt)),
            names(),
            rt.store.meta_values(BACKOFF_NAMESPACE),  # R-BACK-3, as the service keeps it
        )
        used_today: dict[str, int] = {}  # each place's day, as its daily cap counts it
        for place_row in await rt.store.usage_rows(None, _midnight(rt)):
            used_today[place_row.place] = (
                used_today.get(place_row.place, 0) + place_row.tokens_in + place_row.tokens_out
            )
        chat_model = rt.registry.resolve("chat")
        lines: dict[tuple[float, str | None], int | None] = {}
        rows = []
        for act in activity:
            settings = views.resolved_settings(
                act.record, act.session_id, rt.config, stored, skip=("persona",)
            )
            model = rt.registry.get(act.usage_model) if act.usage_model else None
            model = model or chat_model
            compress_at = float(settings["compress_at"]["value"])
            key = (compress_at, model.id if model else None)
            if key not in lines:  # a handful of distinct lines over a thousand sessions
                budget = rt.agent.trim_budget_of(model) if model else None
                lines[key] = views.line_tokens(compress_at, model, budget)
            line = lines[key]
            raw = backoffs.get(act.session_id) or {}
            backoff = Backoff(int(raw.get("failures", 0)), int(raw.get("turns_waited", 0)))
            turns_left = max(0, backoff.wait - backoff.turns_waited) if backoff.failures else 0
            if act.session_id not in measured:
                # A clear of the context forgot its latest usage (as /摘要 says): the ledger's
                # last call measured a memory that is gone.
                act = dataclasses.replace(act, usage=None)
            row = views.overview_row(
                act,
                place_names,
                settings,
                line,
                last.get(act.session_id),
                rt.compression.is_running(act.session_id),
                (backoff.failures, turns_left),
            )
            cap = int(settings["daily_token_cap"]["value"])
            used = used_today.get(usage.usage_place(act.record), 0) if act.record else 0
            row["daily_cap"] = {"cap": cap, "used": used, "spent": 0 < cap <= used}
            rows.append(row)
        today_rows = views.usage_view(today, _models(rt))
        return {
            "sessions": sorted(rows, key=views.overview_order),
            "today": views.totals(today_rows),
            "setting_titles": views.SETTING_TITLES,
        }

    async def _existing(rt: Runtime, sid: str) -> SessionRecord | None:
        record = await rt.store.get_session(sid)
        if (
            record is None
            and not await rt.store.get_history(sid, 1)
            and not await rt.store.get_archived(sid, 1)
        ):
            raise HTTPException(404, "没有这个会话")
        return record

    async def session_page(sid: str) -> dict[str, Any]:
        rt = get_runtime()
        record = await _existing(rt, sid)
        status = await rt.compression.status(sid)
        # A session with both lines off keeps every message active (100,000 of them took a
        # second to read whole, every poll): read only the ends the page shows.
        kept = await rt.compression.kept_originals(sid, status.kept_messages)
        tail = await conversation_end(lambda n: rt.store.get_history(sid, n), RECENT)
        entry = {"entry_platform": record.platform, "entry_type": record.kind} if record else {}
        effective = await rt.settings.effective_all(sid, **entry)
        stored_session = await rt.store.get_settings("session", sid)
        place = views.place_key(record) if record else None
        stored_place = await rt.store.get_settings("place", place) if place else {}
        series = await rt.store.usage_series(sid, CHAT_PURPOSE)
        runs = await rt.store.compressions(sid)
        chat_model = rt.registry.resolve("chat")
        usage = status.usage  # as /摘要 says it: none after a clear of the context
        line = status.line
        if line is None:
            line = views.line_tokens(
                status.compress_at, chat_model, rt.agent.trim_budget_of(chat_model) if chat_model else None
            )
        return {
            "id": sid,
            **views.session_title(sid, record, await names()),
            "group": place is not None,
            "summary": {
                "text": status.summary,
                "time": status.summary_time,
                "sections": views.summary_sections(status.summary),
            },
            "kept": [views.message_view(m) for m in kept],
            "recent": [views.message_view(m) for m in tail[-RECENT:]],
            "active": status.active_messages,
            "usage": usage,
            "line": line,
            "window": status.window or (chat_model.context_window if chat_model else None),
            "history_limit": status.history_limit,
            "usage_ratio": views.fraction(usage, line),
            "count_ratio": views.fraction(status.active_messages, status.history_limit),
            "settings": [
                {
                    "name": name,
                    "title": views.SETTING_TITLES.get(name, name),
                    "value": effective[name].value,
                    "text": views.setting_text(name, effective[name].value),
                    "layer": effective[name].layer,
                    "layer_label": effective[name].layer_label,
                    "session_value": stored_session.get(name),
                    "place_value": stored_place.get(name),
                }
                for name in SETTING_NAMES
            ],
            "series": series,
            "compressions": [views.compression_view(r) for r in runs],
            "running": status.running,
            "progress": live.progress(sid),
            "backoff_failures": status.backoff_failures,
            "backoff_turns_left": status.backoff_turns_left,
            "daily_cap": await _daily_cap(rt, record, int(effective["daily_token_cap"].value)),
            "modes": MODE_WORDS,
        }

    @read.get("/sessions/{sid:path}/search")
    async def search(
        sid: str, q: str, speaker: str | None = None, since: str | None = None, until: str | None = None
    ) -> dict[str, Any]:
        rt = get_runtime()
        await _existing(rt, sid)
        # The recall search of issue 11: this session only, never what a clear removed. The
        # owner's page also finds what was withdrawn (撤回), marked, where the chat's paths don't.
        query = SearchQuery(
            sid,
            q,
            speaker or None,
            _day(rt, since),
            _day(rt, until, end=True),
            SEARCH_LIMIT + 1,
            withdrawn=True,
        )
        found = await rt.store.search(query, context=SEARCH_CONTEXT)
        hits = found[:SEARCH_LIMIT]
        return {
            "more": len(found) > SEARCH_LIMIT,  # more match than are listed: the page says so
            "results": [
                {
                    "hit": views.message_view(h.message, h.withdrawn),
                    "before": [views.message_view(m, h.withdrawn) for m in h.before],
                    "after": [views.message_view(m, h.withdrawn) for m in h.after],
                }
                for h in hits
            ],
        }

    # Session ids are free-form (api.internal_session: "scheduler/daily"): the routes take
    # a `/` in them, the bare page last so that …/search is the search's.
    read.add_api_route("/sessions/{sid:path}", session_page, methods=["GET"])

    @change.post("/sessions/{sid:path}/settings")
    async def change_setting(sid: str, body: SettingChange) -> dict[str, Any]:
        rt = get_runtime()
        record = await _existing(rt, sid)
        if body.name not in SETTING_NAMES:
            raise HTTPException(400, f"没有这项设置：{body.name}")
        name: Any = body.name
        key = sid if body.scope == "session" else (views.place_key(record) if record else None)
        if key is None:
            raise HTTPException(400, "这个会话没有群设置")
        before = (await rt.settings.of_place("mode", record)).value if record is not None else None
        if body.value is None or (isinstance(body.value, str) and body.value.strip() == RESET_WORD):
            # 默认 typed into a field is what it is in every setting command (and what the
            # persona's refusal advises): back to the layer below, never the persona 「默认」.
            await rt.settings.reset(name, body.scope, key)
        else:
            value = views.setting_input(body.name, body.value)
            if value is None:
                raise HTTPException(400, "请填写数字")
            if name == "persona" and (refusal := persona_refusal(rt, str(value).strip())):
                raise HTTPException(400, refusal)  # as /人设 refuses it
            try:
                await rt.settings.set(name, body.scope, key, value)
            except ValueError as err:
                raise HTTPException(400, str(err)) from None
        logger.info(f"memsum: web page changed {body.name} of {body.scope} {key}: {body.value}")
        resolved = await rt.settings.effective_all(
            sid, **({"entry_platform": record.platform, "entry_type": record.kind} if record else {})
        )
        value = resolved[name].value
        if name == "mode" and record is not None:
            await rt.controls.switched(record, before, value)  # noted when switched on from 关
        if name == "mode" and value != "off" and record is not None:
            # A place switched on is judged once, as /记忆模式 does (commands.py).
            await rt.compression.judge_recorded(sid, Entry(record.platform, record.kind))
        return {
            "value": value,
            "text": views.setting_text(name, value),
            "layer_label": resolved[name].layer_label,
        }

    @change.post("/sessions/{sid:path}/compress", status_code=202)
    async def compress(sid: str) -> dict[str, Any]:
        rt = get_runtime()
        await _existing(rt, sid)
        if rt.compression.is_running(sid):
            raise HTTPException(409, "这个会话正在压缩")
        live.start(rt, sid)
        return {"started": True}

    @change.post("/sessions/{sid:path}/clear")
    async def clear(sid: str, body: ClearRequest) -> dict[str, Any]:
        rt = get_runtime()
        await _existing(rt, sid)
        if body.kind == "context" and not body.confirm:
            raise HTTPException(400, "清除上下文需要确认")
        await rt.compression.clear(sid, body.kind)
        logger.info(f"memsum: web page cleared the {body.kind} of {sid}")
        return {"ok": True}

    @read.get("/usage")
    async def usage_page(days: int = 30) -> dict[str, Any]:
        rows = await _usage_rows(get_runtime(), days)
        return {"rows": rows, "totals": views.totals(rows)}

    @read.get("/usage.csv")
    async def usage_csv(days: int = 30) -> Response:
        rows = await _usage_rows(get_runtime(), days)
        return PlainTextResponse(
            "\ufeff" + views.usage_csv(rows),  # the BOM: spreadsheet programs then read UTF-8
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="memsum-usage-{days}d.csv"'},
        )

    api.include_router(read)
    api.include_router(change)
    app.include_router(api)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.state.live = live
    return app


async def _daily_cap(rt: Runtime, record: SessionRecord | None, cap: int) -> dict[str, Any] | None:
    """Today's use of the place's daily cap, counted as the bot counts it before answering
    (every purpose, the day of `MEMSUM_TIMEZONE`; `/用量` says the same): a group that went
    quiet because its cap is spent shows why."""
    if record is None:
        return None
    used = await rt.controls.used_today(record)
    return {"cap": cap, "used": used, "ratio": views.fraction(used, cap), "spent": 0 < cap <= used}


def _session_cookie(response: Response, request: Request, value: str, seconds: int) -> None:
    """The sign-in cookie (`seconds` 0: gone). No Path: the browser scopes it to the folder
    of the sign-in request, the page's own `…/memsum/api`, which every signed-in request
    is under wherever the page is served, as the bot's `/memsum/` or as a reverse proxy's
    `/bot/memsum/` (a Path from the bot's own mount point never matched the proxy's URLs:
    sign-in succeeded and the page asked for the token again)."""
    response.set_cookie(
        COOKIE,
        value,
        max_age=seconds,
        expires=None if seconds else 0,
        path=None,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _from_the_page(request: Request) -> bool:
    headers = request.headers
    return same_origin(headers.get("origin"), headers.get("host"), headers.get("sec-fetch-site"))


def _midnight(rt: Runtime) -> float:
    """When today began in the bot's time zone (`MEMSUM_TIMEZONE`, as /用量 counts days)."""
    return usage.day_start(clock.now(), usage.zone_of(rt.config))


async def _by_day(rt: Runtime, since: float) -> list[DailyUsage]:
    """The ledger per day of the bot's time zone from `since` on: each span of one UTC
    offset asked with its own (a DST day has 23 or 25 hours), the spans' rows merged."""
    merged: dict[tuple[str, str, str], DailyUsage] = {}
    # A second ahead: a row written as the page asks is not left out.
    for start, end, offset in usage.offset_spans(since, clock.now() + 1, usage.zone_of(rt.config)):
        for row in await rt.store.usage_by_day(since=start, utc_offset=offset, until=end):
            key = (row.day, row.model, row.purpose)
            if (seen := merged.get(key)) is not None:
                row = dataclasses.replace(
                    seen,
                    calls=seen.calls + row.calls,
                    tokens_in=seen.tokens_in + row.tokens_in,
                    tokens_out=seen.tokens_out + row.tokens_out,
                    tokens_cached=seen.tokens_cached + row.tokens_cached,
                )
            merged[key] = row
    return sorted(merged.values(), key=lambda r: (r.day, r.model, r.purpose))


def _day(rt: Runtime, text: str | None, *, end: bool = False) -> float | None:
    """A `YYYY-MM-DD` from the page as a day of the bot's time zone (`MEMSUM_TIMEZONE`, as
    `/回忆` and the recall tool read dates): its start, or with `end` the next day's."""
    if not text:
        return None
    try:
        time.strptime(text, "%Y-%m-%d")
        return recall.parse_time(text, end=end, zone=usage.zone_of(rt.config))
    except ValueError:
        raise HTTPException(400, "日期格式应为 YYYY-MM-DD") from None


def _models(rt: Runtime) -> dict[str, ModelConfig]:
    return {m.id: m for m in rt.config.memsum_models}


async def _usage_rows(rt: Runtime, days: int) -> list[dict[str, Any]]:
    if not 1 <= days <= 3660:
        raise HTTPException(400, "天数须在 1 到 3660 之间")
    since = usage.day_start(clock.now(), usage.zone_of(rt.config), days - 1)
    rows = await _by_day(rt, since)
    return views.usage_view(rows, _models(rt))


class _Live:
    """Compressions started from the page: running in the background, watched by polling."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._progress: LRU[str, dict[str, Any]] = LRU()
        """The latest run started from the page, per session (the page polls it)."""

    def start(self, rt: Runtime, sid: str) -> None:
        self._progress[sid] = {"phase": "running", "since": clock.now(), "text": "正在压缩…"}
        task = asyncio.create_task(self._run(rt, sid), name=f"memsum-web-compress-{sid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, rt: Runtime, sid: str) -> None:
        try:
            result = await rt.compression.compress(sid)
        except CompressionError as err:
            self._progress[sid] = {"phase": "error", "since": clock.now(), "text": f"压缩失败：{err.reason}"}
            return
        except Exception:
            logger.exception(f"memsum: compression of {sid} from the web page crashed")
            self._progress[sid] = {"phase": "error", "since": clock.now(), "text": "压缩失败：内部错误"}
            return
        self._progress[sid] = {"phase": "done", "since": clock.now(), "text": receipt(result)}

    def progress(self, sid: str) -> dict[str, Any] | None:
        return self._progress.get(sid)

    async def wait(self) -> None:
        """Until every compression started from the page has ended (tests, shutdown)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
