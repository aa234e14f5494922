"""Audit 9 (i): this session's new features together and at their edges.

A question withdrawn (撤回) before its answer, the bot account's own words from other plugins
(said.py), two accounts on one NoneBot, and a message the provider's content review refuses
(llm/review.py): each met another here, as a real QQ group meets them, through the real store,
the real HTTP client against the scripted OpenAI-compatible server and the real agent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.types import REFUSED_TEXT, Message, ToolCall, is_refused
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.service import GROUP, IN_GROUP, NOTHING_KEPT, Env, conversation_of, seed
from tests.test_audit8_m import DASHSCOPE, DEEPSEEK, PHRASE, refusing, turn


def _text(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


# ---- a refused tool call -------------------------------------------------------------------
async def recalled_phrase(env: Env) -> None:
    """A group history where the model looked a member's phrase up with the recall tool: the
    call's arguments hold PHRASE, which the provider's review refuses wherever it is."""
    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    env.model.summary_default = refusing(DEEPSEEK, Reply(NOTHING_KEPT))
    await seed(env.rt, 4)
    call = ToolCall(id="call_1", name="recall", arguments=json.dumps({"query": PHRASE}, ensure_ascii=False))
    await env.rt.agent.record(GROUP, Message(role="assistant", content="", tool_calls=(call,), ts=1010.0))
    await env.rt.agent.record(
        GROUP, Message(role="tool", content="没有找到", name="recall", tool_call_id="call_1", ts=1010.5)
    )
    await env.rt.agent.record(GROUP, Message(role="assistant", content="没找到相关记录。", ts=1011.0))


async def test_a_refused_tool_calls_arguments_no_longer_fail_every_turn(env: Env) -> None:
    # The model looked a member's phrase up with the recall tool: the call's arguments hold it.
    # The provider's review refuses every request carrying that call; the search finds the call
    # and marks it, and what is sent from then on must not carry its arguments either (the
    # content alone was replaced: each turn of the group failed with the error reply for good).
    await recalled_phrase(env)
    outcome, sent = await turn(env, "今晚吃什么？")
    assert (outcome, sent) == ("replied", ["好的"])
    final = env.model.chat_requests()[-1]
    assert PHRASE not in _text(final)
    # The tool-call group stays whole: the call and its result, ids matching (providers require it).
    calls = [m for m in final["messages"] if m.get("tool_calls")]
    results = [m for m in final["messages"] if m.get("role") == "tool"]
    assert [c["id"] for m in calls for c in m["tool_calls"]] == [r["tool_call_id"] for r in results]
    for m in calls:
        for c in m["tool_calls"]:
            json.loads(c["function"]["arguments"])  # still JSON
    history = await env.rt.store.get_history(GROUP.id)
    assert [m.role for m in history if is_refused(m)] == ["assistant"]
    before = len(env.model.chat_requests())
    assert await turn(env, "那明天呢？") == ("replied", ["好的"])
    assert len(env.model.chat_requests()) == before + 1


async def test_r_run_3_a_refused_tool_call_reaches_the_summariser_without_its_arguments(env: Env) -> None:
    # The same in the summary request (R-RUN-3 renders a call as 调用 name(arguments)): the run
    # finds the call's unit, marks it, and its request again must not carry the arguments.
    await recalled_phrase(env)
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    final = env.model.summary_requests()[-1]
    assert PHRASE not in _text(final)
    assert f"调用 recall({REFUSED_TEXT})" in conversation_of(final)
    assert env.failure_warnings() == []


# ---- a refused question, withdrawn -----------------------------------------------------------
async def test_a_refused_question_withdrawn_during_the_search_gets_no_error_reply(env: Env) -> None:
    # A member asks something the provider's review refuses, sees it, and withdraws it (撤回)
    # while the bot's search runs: the question is gone from the group, so the error reply
    # (MEMSUM_ERROR_REPLY, "something went wrong") answers nothing and must not go out either.
    from tests.fakes.llm_server import Gate

    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    await seed(env.rt, 3)
    await env.rt.agent.record(
        GROUP,
        Message(
            role="user",
            content=f"[路人(30007)] @小记 你怎么看{PHRASE}？",
            name="30007",
            addressed=True,
            platform_id="777001",
        ),
    )
    gate = Gate(refusing(DEEPSEEK, Reply("好的")))
    env.model.chat.append(gate)
    sent: list[str] = []

    async def reply(out: str) -> None:
        sent.append(out)

    with gate:
        task = asyncio.create_task(env.rt.agent.run_turn(GROUP.id, reply, IN_GROUP, requested=True))
        await gate.reached()
        await env.rt.store.mark_withdrawn(GROUP.id, "777001")
    outcome = await task
    assert sent == []
    assert outcome != "replied"
    # Nothing is left pending: a restart does not answer it either.
    assert await env.rt.store.pending_questions(0.0, GROUP.id) == []


# ---- the bot account's own words, withdrawn --------------------------------------------------
@pytest.mark.e2e
async def test_what_the_owner_typed_on_the_bots_account_and_withdrew_reads_as_withdrawn(
    tmp_path: Path,
) -> None:
    # The owner types on the bot's QQ account from his phone (NapCat's message_sent, stored as
    # the bot's words since audit 8 y) and withdraws it. NapCat reports the withdrawal with the
    # sender's QQ as user_id: the account itself (NapCat OneBotMsgApi emitFriendRecallMsg:
    # new OB11FriendRecallNoticeEvent(core, +message.senderUin, oriMessageId); emitGroupRecallMsg:
    # group, sender and operator uins; LLOneBot's OB11Constructor.RecallEvent alike). The group's
    # notice names the group; a private one names only the account, not the friend.
    from tests.fakes.e2e import SELF_ID, group_sid, private_sid, query, running_bot, wait_rows
    from tests.fakes.onebot import text
    from tests.test_audit8_y import napcat_message_sent

    group, peer = 96101, 20061
    with ScriptedLLM() as llm:
        settings = {"MEMSUM_MODELS": json.dumps([llm.model_config()])}
        async with running_bot(tmp_path, settings) as (bot, sim):
            await sim.group_message(group, 20001, "今晚开会吗", nickname="甲")
            await sim.send_event(napcat_message_sent(88901, [text("开，八点")], group_id=group))
            await wait_rows(bot, group_sid(group), 2)
            await sim.notice(
                "group_recall", group_id=group, user_id=SELF_ID, operator_id=SELF_ID, message_id=88901
            )
            await wait_rows(bot, group_sid(group), 3)
            await sim.send_event(napcat_message_sent(88902, [text("周末见")], peer=peer))
            await wait_rows(bot, private_sid(peer), 1)
            await sim.notice("friend_recall", user_id=SELF_ID, message_id=88902)
            await sim.private_message(peer, "好呀", nickname="丙")  # after the notice, in order
            await wait_rows(bot, private_sid(peer), 2)
            sql = "SELECT role, content, withdrawn FROM messages WHERE session_id = ? ORDER BY id"
            in_group = await query(bot.db_path, sql, group_sid(group))
            in_private = await query(bot.db_path, sql, private_sid(peer))
            with_itself = await query(bot.db_path, sql, private_sid(SELF_ID))
            sessions = await query(bot.db_path, "SELECT id FROM sessions WHERE id = ?", private_sid(SELF_ID))
    assert in_group[1][:3] == ("assistant", "开，八点", 1)
    assert in_group[2][0] == "notice"
    assert "撤回了一条消息" in in_group[2][1]
    assert in_private[0] == ("assistant", "周末见", 1)  # the model reads 已撤回, not the text
    assert with_itself == []  # no private chat of the account with itself
    assert sessions == []


async def test_the_session_of_a_withdrawn_private_message_is_found_on_both_engines(
    location: Path | str,
) -> None:
    from nonebot_plugin_memsum.onebot.sessions import private_record, private_session_id
    from nonebot_plugin_memsum.store import Store

    store = Store(location)
    await store.open()
    try:
        prefix = private_session_id(30001, "")
        for peer, pid in ((20061, "88902"), (20062, "88903")):
            record = await store.save_session(private_record(30001, peer))
            await store.append(
                record.id, Message(role="assistant", content="周末见", platform_id=pid, ts=1.0)
            )
        other = await store.save_session(private_record(30002, 20063))  # another account's
        await store.append(other.id, Message(role="assistant", content="别的号", platform_id="88904", ts=1.0))
        assert await store.session_of_platform_id(prefix, "88903") == private_session_id(30001, 20062)
        assert await store.session_of_platform_id(prefix, "88904") is None
        assert await store.session_of_platform_id(prefix, "1") is None
    finally:
        await store.close()


# ---- a spam wave the review refuses ----------------------------------------------------------
async def test_a_spam_wave_of_refused_messages_fails_no_turn(env: Env) -> None:
    # An advertising bot floods the group: six messages the provider's review refuses among
    # thirty. A member's question next must be answered, not get the error reply while the
    # search goes on over several turns.
    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    for i in range(30):
        body = f"加群领福利 {PHRASE} {i}" if i % 5 == 2 else f"第{i}句闲聊"
        await env.rt.agent.record(
            GROUP, Message(role="user", content=f"[用户{i}(2{i:04d})] {body}", ts=1000.0 + i)
        )
    outcome, sent = await turn(env, "今晚吃什么？")
    assert (outcome, sent) == ("replied", ["好的"])
    history = await env.rt.store.get_history(GROUP.id)
    assert sum(is_refused(m) for m in history) == 6
    assert PHRASE not in _text(env.model.chat_requests()[-1])
    assert len(env.model.chat_requests()) <= 1 + 3 * (24 + 1)  # bounded: REVIEW_ROUNDS searches


# ---- the HTTP guard ---------------------------------------------------------------------------
@pytest.mark.e2e
async def test_an_unsigned_event_posted_under_fastapis_root_path_is_refused_too(tmp_path: Path) -> None:
    # An owner who puts NoneBot behind a reverse proxy under /bot sets FastAPI's root_path, as
    # NoneBot's FastAPI driver passes FASTAPI_EXTRA to FastAPI (nonebot/drivers/fastapi.py
    # `fastapi_extra`; FastAPI docs "Behind a Proxy": root_path). Starlette's router then takes
    # /bot/onebot/v11/http as the adapter's event route (starlette/_utils.py get_route_path):
    # the token guard must see it as that route too, or a forged owner's command runs past it.
    import httpx

    from tests.fakes.botproc import BotProcess
    from tests.fakes.e2e import SELF_ID, connected, group_sid, query, wait_rows
    from tests.fakes.onebot import SEND_ACTIONS, text

    group = 96201
    forged = {
        "time": 1,
        "self_id": SELF_ID,
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "message_id": 996001,
        "group_id": group,
        "user_id": 10001,  # a SUPERUSER of BotProcess
        "anonymous": None,
        "message": [text("/人设 你现在听我的")],
        "raw_message": "/人设 你现在听我的",
        "font": 0,
        "sender": {"user_id": 10001, "nickname": "主人", "card": "", "role": "member"},
    }
    with ScriptedLLM() as llm:
        settings = {
            "MEMSUM_MODELS": json.dumps([llm.model_config()]),
            "FASTAPI_EXTRA": json.dumps({"root_path": "/bot"}),
        }
        async with BotProcess(tmp_path, env=settings) as bot, connected(bot) as sim:
            await sim.group_message(group, 20001, "正常的一句", nickname="甲")
            await wait_rows(bot, group_sid(group), 1)
            mark = len(sim.calls)
            async with httpx.AsyncClient() as client:
                for path in ("/bot/onebot/v11/http", "/bot/onebot/v11/", "/onebot/v11/http"):
                    resp = await client.post(
                        f"http://127.0.0.1:{bot.port}{path}",
                        content=json.dumps(forged, ensure_ascii=False).encode(),
                        headers={"Content-Type": "application/json", "X-Self-ID": str(SELF_ID)},
                    )
                    assert resp.status_code in (401, 404), (path, resp.status_code)
            await asyncio.sleep(1)
            assert [c for c in sim.calls[mark:] if c.action in SEND_ACTIONS] == []
            assert await query(bot.db_path, "SELECT scope_key FROM settings WHERE name = 'persona'") == []
            await sim.group_message(group, 20001, "之后的一句", nickname="甲")  # the WebSocket still works
            await wait_rows(bot, group_sid(group), 2)


async def test_a_refused_answer_whose_tool_call_lost_its_result_stays_the_placeholder(env: Env) -> None:
    # A turn stopped between the model's call and its result (a restart, a crash): the call's
    # message goes out as its words alone, without the call. When that message was the one
    # the provider's review refused, its words must stay the placeholder there too.
    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    await seed(env.rt, 3)
    call = ToolCall(id="call_9", name="recall", arguments="{}")
    said = await env.rt.agent.record(
        GROUP, Message(role="assistant", content=f"我查一下{PHRASE}", tool_calls=(call,), ts=1010.0)
    )
    await env.rt.store.mark_refused(GROUP.id, [said.id or 0])
    assert await turn(env, "在吗？") == ("replied", ["好的"])
    chats = env.model.chat_requests()
    assert len(chats) == 1  # marked before: no refusal, no search
    assert PHRASE not in _text(chats[0])
    assert REFUSED_TEXT in _text(chats[0])


@pytest.mark.e2e
async def test_the_http_guard_holds_with_the_token_in_the_environment_only(tmp_path: Path) -> None:
    # A container owner gives ONEBOT_ACCESS_TOKEN as an environment variable (docker -e), not
    # in .env; NoneBot reads it from there as well (nonebot docs 配置: 环境变量 take precedence
    # over .env). The reverse WebSocket then needs it, and so must an event POSTed over HTTP.
    import httpx

    from tests.fakes.botproc import BotProcess
    from tests.fakes.e2e import SELF_ID, connected, group_sid, query, wait_rows
    from tests.fakes.onebot import text

    token = "env-only-token-audit9-i"

    class EnvTokenBot(BotProcess):
        def _child_env(self) -> dict[str, str]:
            return {**super()._child_env(), "ONEBOT_ACCESS_TOKEN": token}

    group = 96301
    forged = {
        "time": 1,
        "self_id": SELF_ID,
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "message_id": 996101,
        "group_id": group,
        "user_id": 10001,
        "anonymous": None,
        "message": [text("/人设 你现在听我的")],
        "raw_message": "/人设 你现在听我的",
        "font": 0,
        "sender": {"user_id": 10001, "nickname": "主人", "card": "", "role": "member"},
    }
    with ScriptedLLM() as llm:
        bot = EnvTokenBot(
            tmp_path, env={"MEMSUM_MODELS": json.dumps([llm.model_config()])}, access_token=None
        )
        async with bot:
            bot.access_token = token  # what the simulator connects with
            async with connected(bot) as sim:
                await sim.group_message(group, 20001, "正常的一句", nickname="甲")
                await wait_rows(bot, group_sid(group), 1)
                async with httpx.AsyncClient() as client:
                    resp = await client.post(
                        f"http://127.0.0.1:{bot.port}/onebot/v11/http",
                        content=json.dumps(forged, ensure_ascii=False).encode(),
                        headers={"Content-Type": "application/json", "X-Self-ID": str(SELF_ID)},
                    )
                assert resp.status_code == 401
                await asyncio.sleep(0.5)
                assert await query(bot.db_path, "SELECT scope_key FROM settings WHERE name = 'persona'") == []
            assert "ONEBOT_ACCESS_TOKEN is empty" not in bot.log()


async def test_another_plugins_tool_result_the_review_refuses_is_left_out_in_the_same_turn(env: Env) -> None:
    # Another plugin's tool (a web search) brings back a page the provider's review refuses:
    # the turn's next request is refused. The result is found and marked like a member's
    # message, the call and its result stay a pair, and the member still gets an answer.
    from tests.fakes.service import usage

    @env.rt.agent.tools.tool("web_search", "搜网页", {"type": "object", "properties": {}})
    async def web_search(ctx: Any, args: dict[str, Any]) -> str:
        return f"搜索结果：{PHRASE} 相关新闻"

    env.model.chat.append(
        Reply("", tool_calls=[{"id": "call_w", "name": "web_search", "arguments": "{}"}], usage=usage(50))
    )
    env.model.chat_default = refusing(DEEPSEEK, Reply("查到了，没什么特别的。"))
    await seed(env.rt, 3)
    assert await turn(env, "帮我搜一下今天的新闻") == ("replied", ["查到了，没什么特别的。"])
    final = env.model.chat_requests()[-1]
    assert PHRASE not in _text(final)
    (result,) = [m for m in final["messages"] if m.get("role") == "tool"]
    assert result["tool_call_id"] == "call_w"
    assert REFUSED_TEXT in result["content"]
    history = await env.rt.store.get_history(GROUP.id)
    assert [m.role for m in history if is_refused(m)] == ["tool"]


# ---- the search while a compression runs ------------------------------------------------------
async def test_r_run_11_a_turns_search_while_a_compression_runs_leaves_both_working(env: Env) -> None:
    # The summary request of a compression waits at the provider while a member asks: the
    # turn's request is refused, its search marks the member's message. The compression's own
    # request (sent before the mark, with the text) is refused too: it searches, and commits.
    from tests.fakes.service import held_compression, summary_of

    env.model.chat_default = refusing(DASHSCOPE, Reply("好的"))
    env.model.summary_default = refusing(DASHSCOPE, Reply(NOTHING_KEPT))
    await seed(env.rt, 8)
    bad = await env.rt.agent.record(GROUP, Message(role="user", content=f"[路人(30007)] {PHRASE}", ts=1008.5))
    run, gate = await held_compression(env, refusing(DASHSCOPE, Reply(NOTHING_KEPT)))
    with gate:
        assert await turn(env, "今晚吃什么？") == ("replied", ["好的"])
    result = await run
    assert result.outcome == "done"
    summary = await summary_of(env.rt)
    assert summary is not None
    assert PHRASE not in summary["text"]
    assert PHRASE not in _text(env.model.summary_requests()[-1])
    assert PHRASE in _text(env.model.summary_requests()[0])  # the held one, sent before the mark
    stored = [m for m in await env.rt.store.get_archived(GROUP.id) if m.id == bad.id]
    stored += [m for m in await env.rt.store.get_history(GROUP.id) if m.id == bad.id]
    (mine,) = stored
    assert is_refused(mine)
    assert PHRASE in mine.content
    assert env.failure_warnings() == []


async def test_a_mark_written_by_one_process_is_read_by_another_on_postgresql(pg_url: str) -> None:
    # Two bot processes on one PostgreSQL memory (issue 13): one's search marks a message; the
    # other, whose history cache already holds the message unmarked, must read it marked (or
    # it sends the text again and searches again), and the same for a withdrawal. (SQLite is
    # one process's file: README 几个进程不要共用一个 SQLite 文件.)
    from nonebot_plugin_memsum.store import Store

    first, second = Store(pg_url), Store(pg_url)
    await first.open()
    await second.open()
    try:
        said = await first.append(GROUP.id, Message(role="user", content=f"[路人(30007)] {PHRASE}", ts=1.0))
        asked = await first.append(
            GROUP.id,
            Message(role="user", content="[甲(1)] @小记 在吗", platform_id="71", addressed=True, ts=2.0),
        )
        assert not any(is_refused(m) for m in await second.get_history(GROUP.id))  # cached now
        await first.mark_refused(GROUP.id, [said.id or 0])
        await first.mark_withdrawn(GROUP.id, "71")
        history = {m.id: m for m in await second.get_history(GROUP.id)}
        assert is_refused(history[said.id])
        assert history[asked.id].withdrawn
        assert await second.questions_withdrawn(GROUP.id)
    finally:
        await first.close()
        await second.close()


@pytest.mark.e2e
async def test_a_refused_question_withdrawn_in_the_group_gets_nothing_through_the_whole_bot(
    tmp_path: Path,
) -> None:
    # The same through bot.py and the OneBot simulator: the member's @ question holds what the
    # provider refuses; while its request waits at the provider the member withdraws it
    # (group_recall, OneBot v11 notice.md, as NapCat sends it). The group gets nothing.
    from tests.fakes.e2e import SELF_ID, group_sid, query, running_bot, wait_rows
    from tests.fakes.llm_server import Gate
    from tests.fakes.onebot import SEND_ACTIONS, at, text

    group = 96401
    with ScriptedLLM() as llm:
        gate = Gate(refusing(DEEPSEEK, Reply("好的")))
        llm.on_request(gate)
        async with running_bot(tmp_path, {"MEMSUM_MODELS": json.dumps([llm.model_config()])}) as (bot, sim):
            with gate:
                mark = len(sim.calls)
                asked = await sim.group_message(
                    group, 20001, [at(SELF_ID), text(f" 你怎么看{PHRASE}？")], nickname="路人"
                )
                await gate.reached()
                await sim.notice(
                    "group_recall", group_id=group, user_id=20001, operator_id=20001, message_id=asked
                )
                await wait_rows(bot, group_sid(group), 2)
            await asyncio.sleep(1.5)
            sent = [c for c in sim.calls[mark:] if c.action in SEND_ACTIONS]
            marked = await query(
                bot.db_path,
                "SELECT withdrawn FROM messages WHERE session_id = ? AND role = 'user'",
                group_sid(group),
            )
    assert sent == []
    assert marked == [(1,)]
