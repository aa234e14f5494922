"""The web page's HTTP API against a real uvicorn server (httpx), on a private runtime with a
real SQLite file and the scripted model server: sign-in, cross-site protection, every
endpoint, and chat text that stays text."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from nonebot_plugin_memsum import clock, usage
from nonebot_plugin_memsum.config import ConfigError, parse_config
from nonebot_plugin_memsum.web import auth, views
from nonebot_plugin_memsum.web.app import STATIC
from tests.fakes.llm_server import API_KEY, Gate, Reply
from tests.fakes.web import (
    CHAT_TURNS,
    COMPRESSIONS,
    GROUP,
    GROUP_NAME,
    HTML,
    LINE,
    PRIVATE,
    SUMMARY,
    TOKEN,
    WebEnv,
    web_env,
)

G = GROUP.id.replace(":", "%3A")
READS = ["api/me", "api/overview", f"api/sessions/{G}", f"api/sessions/{G}/search?q=爬山", "api/usage"]
READS += ["api/usage.csv"]
CHANGES = [
    (f"api/sessions/{G}/settings", {"name": "compress_at", "value": 0.5}),
    (f"api/sessions/{G}/compress", {}),
    (f"api/sessions/{G}/clear", {"kind": "context", "confirm": True}),
    ("api/logout", {}),
]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[WebEnv]:
    async with web_env(tmp_path) as e:
        yield e


@pytest.fixture
async def anon(env: WebEnv) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=env.base + "/") as client:
        yield client


@pytest.fixture
async def owner(env: WebEnv) -> AsyncIterator[httpx.AsyncClient]:
    """Signed in; the CSRF header set as the page sets it."""
    async with httpx.AsyncClient(base_url=env.base + "/") as client:
        resp = await client.post("api/login", json={"token": TOKEN})
        assert resp.status_code == 200
        client.headers["X-Memsum-CSRF"] = resp.json()["csrf"]
        yield client


async def active_count(env: WebEnv) -> int:
    return len(await env.rt.store.get_history(GROUP.id))


# ---- sign-in ---------------------------------------------------------------------------
async def test_no_access_without_signing_in(env: WebEnv, anon: httpx.AsyncClient) -> None:
    for path in READS:
        resp = await anon.get(path)
        assert resp.status_code == 401, path
        assert "爬山" not in resp.text
    before = await active_count(env)
    for path, body in CHANGES:
        assert (await anon.post(path, json=body)).status_code == 401, path
    assert await active_count(env) == before
    # A made-up cookie is no session either.
    anon.cookies.set("memsum_session", "forged")
    assert (await anon.get("api/overview")).status_code == 401
    # The page itself and its assets load (they hold no data): the sign-in form is in the script.
    page = await anon.get("")
    assert page.status_code == 200
    assert "static/app.js" in page.text


async def test_sign_in_sets_an_httponly_samesite_cookie(anon: httpx.AsyncClient) -> None:
    resp = await anon.post("api/login", json={"token": TOKEN})
    assert resp.status_code == 200
    cookie = resp.headers["set-cookie"]
    assert cookie.startswith("memsum_session=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    # No Path: the browser scopes it to the sign-in's folder, the page's own api/, under
    # whatever prefix a reverse proxy serves the page (tests/test_audit8_x.py).
    assert "path=" not in cookie.lower()
    csrf = resp.json()["csrf"]
    assert (await anon.get("api/me")).json() == {"csrf": csrf}
    # Signing out ends the session on the server, not only in the browser.
    sid = anon.cookies["memsum_session"]
    out = await anon.post("api/logout", json={}, headers={"X-Memsum-CSRF": csrf})
    assert out.status_code == 200
    anon.cookies.set("memsum_session", sid)
    assert (await anon.get("api/overview")).status_code == 401


async def test_wrong_token_is_refused_and_repeated_failures_slowed(
    anon: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [clock.now()]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    for _ in range(auth.FREE_FAILURES):
        resp = await anon.post("api/login", json={"token": TOKEN[:-1] + "x"})
        assert resp.status_code == 401
        assert resp.json()["detail"] == "令牌不对"
        assert "set-cookie" not in resp.headers
    # Now the address waits, and even the right token is not tried until it has.
    resp = await anon.post("api/login", json={"token": TOKEN})
    assert resp.status_code == 429
    assert int(resp.headers["Retry-After"]) >= 1
    assert "set-cookie" not in resp.headers
    now[0] += auth.failure_wait(auth.FREE_FAILURES) + 0.1
    resp = await anon.post("api/login", json={"token": TOKEN})
    assert resp.status_code == 200


def test_failure_wait_doubles_up_to_its_cap() -> None:
    waits = [auth.failure_wait(n) for n in range(1, 20)]
    assert waits[: auth.FREE_FAILURES - 1] == [0.0] * (auth.FREE_FAILURES - 1)
    assert waits[auth.FREE_FAILURES - 1 : auth.FREE_FAILURES + 2] == [1.0, 2.0, 4.0]
    assert max(waits) == auth.MAX_WAIT
    assert auth.same_token(TOKEN, TOKEN)
    assert not auth.same_token(TOKEN, TOKEN + "x")


def test_web_token_must_not_be_guessable() -> None:
    with pytest.raises(ConfigError, match=r"MEMSUM_WEB_TOKEN.*16") as err:
        parse_config({"memsum_web_token": "short-secret"})
    assert "short-secret" not in str(err.value)
    assert parse_config({}).memsum_web_token.get_secret_value() == ""


# ---- cross-site changes ----------------------------------------------------------------
async def test_forged_cross_site_changes_are_refused(env: WebEnv, owner: httpx.AsyncClient) -> None:
    before = await active_count(env)
    csrf = owner.headers.pop("X-Memsum-CSRF")
    for path, body in CHANGES:
        # The cookie alone (what a cross-site form or fetch would carry) is not enough.
        assert (await owner.post(path, json=body)).status_code == 403, path
        wrong = {"X-Memsum-CSRF": "guessed"}
        assert (await owner.post(path, json=body, headers=wrong)).status_code == 403, path
        # Nor the right token from a foreign page.
        foreign = {"X-Memsum-CSRF": csrf, "Origin": "https://evil.example"}
        assert (await owner.post(path, json=body, headers=foreign)).status_code == 403, path
    assert await active_count(env) == before
    effective = await env.rt.settings.effective("compress_at", GROUP.id)
    assert effective.layer == "global"
    # A sign-in posted by another site is refused too (login CSRF).
    resp = await owner.post("api/login", json={"token": TOKEN}, headers={"Origin": "https://evil.example"})
    assert resp.status_code == 403
    # The page's own origin passes.
    own = {"X-Memsum-CSRF": csrf, "Origin": env.base.rsplit("/memsum", 1)[0]}
    resp = await owner.post(CHANGES[0][0], json=CHANGES[0][1], headers=own)
    assert resp.status_code == 200


# ---- reading -----------------------------------------------------------------------------
async def test_overview_lists_every_session_with_counts_lines_and_today(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # A chat call (priced) and a summary call (not) at the real now, no session's, so today is
    # never empty: between midnight and about three the whole seed, begun three hours ago,
    # lies in yesterday.
    await env.rt.store.record_usage(None, "对话", "test/chat", 120, 30)
    await env.rt.store.record_usage(None, "摘要", "test/summary", 200, 40)
    data = (await owner.get("api/overview")).json()
    rows = {r["id"]: r for r in data["sessions"]}
    assert set(rows) == {GROUP.id, PRIVATE.id}
    group, private = rows[GROUP.id], rows[PRIVATE.id]
    assert (group["kind"], group["number"], group["name"]) == ("群聊", "123456", GROUP_NAME)
    assert (private["kind"], private["number"], private["name"]) == ("私聊", "20002", "小明")
    history = await env.rt.store.get_history(GROUP.id)
    archived = await env.rt.store.get_archived(GROUP.id)
    assert group["active"] == sum(m.is_conversation for m in history)  # R-TRIG-4's count
    assert group["archived"] == len(archived)
    assert (private["active"], private["archived"]) == (2, 0)
    # The last chat call's prompt size against the line 0.08 × 8000 of the chat model.
    series = await env.rt.store.usage_series(GROUP.id, "对话")
    assert group["usage"] == series[-1][1]
    assert group["line"] == LINE
    assert group["usage_ratio"] == round(series[-1][1] / LINE, 4)
    assert group["settings"]["compress_at"] == {
        "value": 0.08,
        "text": "0.08",
        "layer": "global",
        "layer_label": "全局配置",
    }
    assert group["settings"]["mode"]["text"] == "开"
    assert "persona" not in group["settings"]  # long text, not for a thousand rows
    assert group["last_compression"]["outcome"] == "done"
    assert private["last_compression"] is None
    assert private["usage"] is None
    assert group["backoff_failures"] == 0
    assert not group["running"]
    # Today in the bot's time zone: the call above, and the seed's calls made since midnight.
    ledger = await env.rt.store.usage_by_day(since=usage.day_start(clock.now(), usage.zone_of(env.rt.config)))
    assert data["today"]["calls"] == sum(r.calls for r in ledger) > 0
    assert data["today"]["tokens_in"] == sum(r.tokens_in for r in ledger)
    # The chat model has prices (per million tokens), the summary model none.
    chat = [r for r in ledger if r.model == "test/chat"]
    expected = sum(r.tokens_in * 2 + r.tokens_out * 8 for r in chat) / 1e6
    assert data["today"]["cost"] == {"元": pytest.approx(expected)}
    assert data["today"]["unpriced"] is True


async def test_overview_shows_a_failing_session_backing_off(env: WebEnv, owner: httpx.AsyncClient) -> None:
    # R-BACK-3: a failed background run; the model answers 500 from now on.
    env.llm.reset()
    env.llm.default = Reply(status=500)
    await env.rt.compression._background_run(GROUP.id)
    row = next(r for r in (await owner.get("api/overview")).json()["sessions"] if r["id"] == GROUP.id)
    assert row["last_compression"]["outcome"] == "error"
    assert row["last_compression"]["reason"].startswith("摘要模型出错")
    assert (row["backoff_failures"], row["backoff_turns_left"]) == (1, 2)


async def test_session_page_has_summary_kept_chart_history_and_settings(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    d = (await owner.get(f"api/sessions/{G}")).json()
    assert [s["title"] for s in d["summary"]["sections"]] == [
        "最近在聊什么",
        "谁有问题没回应",
        "关键原话要点",
    ]
    assert "集合时间周六八点" in d["summary"]["text"]
    assert "保留原文" not in d["summary"]["text"]
    assert [p[1] for p in d["series"]] == [p[1] for p in await env.rt.store.usage_series(GROUP.id, "对话")]
    assert len(d["series"]) == CHAT_TURNS
    assert len(d["compressions"]) == COMPRESSIONS
    run = d["compressions"][0]  # the newest
    assert run["outcome"] == "done"
    assert run["requests"] == 1
    assert run["kept"] == 1
    # Every archived message was archived by one of the runs.
    assert sum(r["archived"] for r in d["compressions"]) == len(await env.rt.store.get_archived(GROUP.id))
    # The kept original: the first active message, said before the last compression.
    (kept,) = d["kept"]
    first = (await env.rt.store.get_history(GROUP.id))[0]
    assert (kept["id"], kept["content"]) == (first.id, first.content)
    assert "周末去爬山吗" in kept["content"]
    assert kept["ts"] < run["ts"]
    assert run["tokens_before"] > run["tokens_after"] > 0
    assert run["line"] == LINE
    assert [(s["name"], s["value"], s["layer_label"]) for s in d["settings"]] == [
        ("compress_at", 0.08, "全局配置"),
        ("history_limit", 0, "全局配置"),
        ("mode", "on", "全局配置"),
        ("persona", env.rt.config.memsum_persona, "全局配置"),
        ("daily_token_cap", 0, "全局配置"),
    ]
    assert d["group"] is True
    assert d["line"] == LINE
    assert d["window"] == 8000
    assert (await owner.get("api/sessions/onebot%3A1%3Agroup%3A404")).status_code == 404


async def test_search_finds_archived_words_in_context_in_this_session_only(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # The recall search of issue 11: an archived line (compressed three times since) is found
    # with its neighbours; the private chat never sees the group's words.
    resp = await owner.get(f"api/sessions/{G}/search", params={"q": "第5句"})
    (result,) = resp.json()["results"]
    assert result["hit"]["content"].endswith("第5句：周末去爬山吗，带上水和干粮，顺便拍照")
    assert "第4句" in result["before"][-1]["content"]
    assert len(result["before"]) == 2
    assert len(result["after"]) == 2
    archived = {m.id for m in await env.rt.store.get_archived(GROUP.id)}
    assert result["hit"]["id"] in archived
    by_speaker = await owner.get(f"api/sessions/{G}/search", params={"q": "爬山", "speaker": "30005"})
    assert [r["hit"]["content"][:11] for r in by_speaker.json()["results"]] == ["[成员5(30005)"]
    p = PRIVATE.id.replace(":", "%3A")
    assert (await owner.get(f"api/sessions/{p}/search", params={"q": "第5句"})).json() == {
        "results": [],
        "more": False,
    }
    bad = await owner.get(f"api/sessions/{G}/search", params={"q": "爬山", "since": "昨天"})
    assert (bad.status_code, bad.json()["detail"]) == (400, "日期格式应为 YYYY-MM-DD")
    # Cleared is never found again (R-MEM-2).
    await owner.post(f"api/sessions/{G}/clear", json={"kind": "context", "confirm": True})
    assert (await owner.get(f"api/sessions/{G}/search", params={"q": "第5句"})).json() == {
        "results": [],
        "more": False,
    }


async def test_usage_per_day_model_and_purpose_and_csv(env: WebEnv, owner: httpx.AsyncClient) -> None:
    data = (await owner.get("api/usage?days=7")).json()
    ledger = await env.rt.store.usage_by_day()
    assert [
        (r["model"], r["purpose"], r["calls"], r["tokens_in"], r["tokens_out"]) for r in data["rows"]
    ] == [(r.model, r.purpose, r.calls, r.tokens_in, r.tokens_out) for r in ledger]
    assert {r["purpose"] for r in data["rows"]} == {"对话", "摘要"}
    assert data["totals"]["calls"] == CHAT_TURNS + COMPRESSIONS
    resp = await owner.get("api/usage.csv?days=7")
    assert resp.headers["content-type"].startswith("text/csv")
    assert "attachment" in resp.headers["content-disposition"]
    lines = resp.content.decode("utf-8-sig").splitlines()
    assert lines[0] == "日期,模型,用途,调用次数,输入 token,其中缓存命中,输出 token,费用,币种"
    assert len(lines) == 1 + len(ledger)
    assert (await owner.get("api/usage?days=0")).status_code == 400


# ---- changing ------------------------------------------------------------------------------
async def test_settings_change_through_the_same_layer_as_the_commands(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    resp = await owner.post(f"api/sessions/{G}/settings", json={"name": "compress_at", "value": "0.5"})
    assert resp.json() == {"value": 0.5, "text": "0.5", "layer_label": "本会话"}
    assert (await env.rt.settings.effective("compress_at", GROUP.id)).value == 0.5  # what /压缩线 reads
    # The place layer, for the whole group; the session layer still wins over it.
    body = {"name": "history_limit", "scope": "place", "value": 40}
    assert (await owner.post(f"api/sessions/{G}/settings", json=body)).json()["layer_label"] == "本群"
    assert await env.rt.store.get_settings("place", "onebot:group:123456") == {"history_limit": 40}
    # Out of range, not a number, no such setting, no group of a private chat: refused, nothing changed.
    bad = [
        ({"name": "compress_at", "value": 1.5}, "压缩线须在 0 到 1 之间"),
        ({"name": "history_limit", "value": 2.5}, "条数线须是"),
        ({"name": "compress_at", "value": "abc"}, "请填写数字"),
        ({"name": "api_key", "value": 1}, "没有这项设置"),
    ]
    for body, message in bad:
        resp = await owner.post(f"api/sessions/{G}/settings", json=body)
        assert (resp.status_code, message in resp.json()["detail"]) == (400, True), body
    p = PRIVATE.id.replace(":", "%3A")
    resp = await owner.post(
        f"api/sessions/{p}/settings", json={"name": "compress_at", "scope": "place", "value": 0.3}
    )
    assert resp.status_code == 400
    assert (await env.rt.settings.effective("compress_at", GROUP.id)).value == 0.5
    # Back to the layer below.
    resp = await owner.post(f"api/sessions/{G}/settings", json={"name": "compress_at", "value": None})
    assert resp.json() == {"value": 0.08, "text": "0.08", "layer_label": "全局配置"}


async def test_mode_persona_and_daily_cap_change_like_the_owner_commands(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # The owner's controls (issue 10) through the same settings layer as /记忆模式, /人设, /限额.
    path = f"api/sessions/{G}/settings"
    resp = await owner.post(path, json={"name": "mode", "scope": "place", "value": "仅记录"})
    assert resp.json() == {"value": "record", "text": "仅记录", "layer_label": "本群"}
    assert (await env.rt.settings.effective("mode", GROUP.id)).value == "record"
    resp = await owner.post(path, json={"name": "persona", "scope": "place", "value": "你是<b>爬山</b>向导"})
    assert resp.json()["value"] == "你是<b>爬山</b>向导"
    resp = await owner.post(path, json={"name": "daily_token_cap", "scope": "place", "value": "50000"})
    assert resp.json() == {"value": 50000, "text": "50000", "layer_label": "本群"}
    bad = await owner.post(path, json={"name": "mode", "value": "半开"})
    assert (bad.status_code, bad.json()["detail"]) == (400, "模式须是 开、仅记录 或 关")
    row = next(r for r in (await owner.get("api/overview")).json()["sessions"] if r["id"] == GROUP.id)
    assert (row["settings"]["mode"]["text"], row["settings"]["daily_token_cap"]["value"]) == ("仅记录", 50000)


async def test_compress_now_runs_in_the_background_with_progress(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    env.llm.reset()
    gate = Gate(Reply(SUMMARY))
    env.llm.on_request(gate)
    with gate:
        assert (await owner.post(f"api/sessions/{G}/compress", json={})).status_code == 202
        await gate.reached()
        d = (await owner.get(f"api/sessions/{G}")).json()
        assert d["running"] is True
        assert d["progress"]["phase"] == "running"
        # R-PROG-3: one run per session.
        assert (await owner.post(f"api/sessions/{G}/compress", json={})).status_code == 409
    await env.app.state.live.wait()
    d = (await owner.get(f"api/sessions/{G}")).json()
    assert d["running"] is False
    assert d["progress"]["phase"] == "done"
    assert d["progress"]["text"].startswith("压缩完成：")
    assert [r["outcome"] for r in d["compressions"]] == ["done"] * (COMPRESSIONS + 1)


async def test_clear_context_only_when_confirmed(env: WebEnv, owner: httpx.AsyncClient) -> None:
    before = await active_count(env)
    resp = await owner.post(f"api/sessions/{G}/clear", json={"kind": "context"})
    assert resp.status_code == 400
    assert resp.json()["detail"] == "清除上下文需要确认"
    assert await active_count(env) == before
    assert (await owner.post(f"api/sessions/{G}/clear", json={"kind": "summary"})).status_code == 200
    assert await env.rt.compression.summary(GROUP.id) is None
    assert await active_count(env) == before  # R-MEM-2: the summary alone
    resp = await owner.post(f"api/sessions/{G}/clear", json={"kind": "context", "confirm": True})
    assert resp.status_code == 200
    assert await active_count(env) == 0
    assert (
        await owner.post(f"api/sessions/{G}/clear", json={"kind": "all", "confirm": True})
    ).status_code == 422


def test_summary_sections_are_the_template_sections_however_the_model_heads_them() -> None:
    # R-TPL-1/2: the page cuts a summary at its template's sections, whether the model wrote
    # them as the prompt asks (`## 标题`), glued (`##标题`), in bold or in 【】; a topic
    # sub-heading, a `#3` the summary refers to and a QQ `#话题` stay in the body.
    work = "前言\n##目标\n修登录\n**做过的决定**\n用 JWT\n## 改过的文件\n#3 改了 auth.py\n【未完成的事】\n无"
    assert [(s["title"], s["body"]) for s in views.summary_sections(work)] == [
        ("", "前言"),
        ("目标", "修登录"),
        ("做过的决定", "用 JWT"),
        ("改过的文件", "#3 改了 auth.py"),
        ("未完成的事", "无"),
    ]
    chat = "## 最近在聊什么\n### 原神\n#原神 新版本\n## 谁有问题没回应\n无"
    assert views.summary_sections(chat) == [
        {"title": "最近在聊什么", "body": "### 原神\n#原神 新版本"},
        {"title": "谁有问题没回应", "body": "无"},
    ]
    assert views.summary_sections("只有一段话") == [{"title": "", "body": "只有一段话"}]
    assert views.summary_sections(None) == []


# ---- what the page never does --------------------------------------------------------------
async def test_chat_html_is_data_and_the_page_only_ever_writes_text(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    d = (await owner.get(f"api/sessions/{G}")).json()
    assert any(m["content"].endswith(HTML) for m in d["recent"])  # as it was said, not escaped twice
    assert HTML in d["summary"]["sections"][0]["body"]
    assert d["name"] == GROUP_NAME
    # Every response is JSON (or CSV, or a static file), never HTML built from data …
    for path in READS[1:]:
        resp = await owner.get(path)
        assert not resp.headers["content-type"].startswith("text/html"), path
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    # … the page's script puts it in with textContent only, and the CSP forbids inline script.
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    assert not re.search(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", script
    )
    page = await owner.get("")
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert "<script>" not in page.text  # no inline script to allow


async def test_api_keys_are_never_sent_to_the_page(env: WebEnv, owner: httpx.AsyncClient) -> None:
    for path in READS:
        assert API_KEY not in (await owner.get(path)).text, path
    for asset in ("", "static/app.js", "static/app.css"):
        assert API_KEY not in (await owner.get(asset)).text
