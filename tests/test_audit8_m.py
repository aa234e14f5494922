"""Audit 8 (m): one message a provider's content review refuses must not kill a group's memory.

Chinese providers review the input of every request and refuse the whole request when any part
of it is judged sensitive. In a QQ group one member's message (politics, porn spam, a scam link)
then poisoned every later request of that group: every chat turn failed with MEMSUM_ERROR_REPLY
while it was in the active history, and the compression's summary request (R-RUN-1 sends the
whole active history) was refused on every try, so R-RUN-11 / R-BACK backed off for ever and the
memory never compressed again. These scenarios replay each provider's real refusal body through
the scripted OpenAI-compatible server (refusing any request whose body holds a given phrase),
the real client, the real store (both engines where the mark is stored) and the real compression
service and agent, and one through bot.py and the OneBot simulator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.errors import CompressionError
from nonebot_plugin_memsum.llm.client import LLMClient
from nonebot_plugin_memsum.llm.errors import (
    LLMInputRefused,
    in_chinese,
    is_context_too_long,
    is_input_refused,
)
from nonebot_plugin_memsum.llm.review import ProbeLimit, find_refused
from nonebot_plugin_memsum.types import REFUSED_KEY, REFUSED_TEXT, Message, is_refused
from tests.fakes.llm_server import Reply, ScriptedLLM, transcript
from tests.fakes.service import (
    GROUP,
    IN_GROUP,
    NOTHING_KEPT,
    OLD_SUMMARY,
    Env,
    Make,
    conversation_of,
    existing_summary_of,
    seed,
    summary_of,
)
from tests.test_audit8_z import ZHIPU_1301

PHRASE = "某敏感口号"
WEB_TOKEN = "web-token-audit8-m-0123456789"
"""What the scripted provider's review refuses, wherever it is in a request."""

# ---- each provider's refusal, as its documentation and bug reports show it ------------------
# DashScope/Qwen (OpenAI-compatible mode): camel-ai/owl#432 and Samueli924/chaoxing#539 (HTTP 400,
# code and type data_inspection_failed, id and request_id beside the error).
DASHSCOPE = {
    "error": {
        "code": "data_inspection_failed",
        "param": None,
        "message": "Input data may contain inappropriate content.",
        "type": "data_inspection_failed",
    },
    "id": "chatcmpl-11a6c2af-d157-44b6-b7fb-b7ec00f936b0",
    "request_id": "11a6c2af-d157-44b6-b7fb-b7ec00f936b0",
}
# DashScope's newer wording: CommandCodeAI/command-code#813 (HTTP 400, the same code and type).
DASHSCOPE_ALGO = {
    "error": {
        "message": "<400> InternalError.Algo.DataInspectionFailed: Input text data may contain "
        "inappropriate content.",
        "type": "data_inspection_failed",
        "param": None,
        "code": "data_inspection_failed",
    }
}
# Moonshot/Kimi: 666ghj/BettaFish#368 (HTTP 400, type content_filter, param prompt).
MOONSHOT = {
    "error": {
        "code": 400,
        "message": "The request was rejected because it was considered high risk",
        "param": "prompt",
        "type": "content_filter",
    }
}
# Volcengine Ark: code InputTextSensitiveContentDetected with this message (Ark's 错误码 page, as
# the projects that map it quote it), in Ark's OpenAI-style {"error": {code, message, param, type}}.
ARK = {
    "error": {
        "code": "InputTextSensitiveContentDetected",
        "message": "The request failed because the input text may contain sensitive information. "
        "Request id: 021718067849267d2b8f7f0b8e5d1c0f0a1b2c3d4e5f6a7b8c9d0",
        "param": "",
        "type": "BadRequest",
    }
}
# Azure OpenAI: openai/openai-python#331, compl-ai/compl-ai#20 (HTTP 400, code content_filter, the
# prompt's filter results under innererror).
AZURE = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry. To learn more about our content "
        "filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": False, "severity": "safe"},
                "jailbreak": {"filtered": False, "detected": False},
                "self_harm": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": False, "severity": "safe"},
                "violence": {"filtered": True, "severity": "medium"},
            },
        },
    }
}
# DeepSeek: 666ghj/BettaFish#108 (HTTP 400, type and code invalid_request_error).
DEEPSEEK = {
    "error": {
        "message": "Content Exists Risk",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }
}
# one-api / new-api gateways in front of any of them: openai/openai-cookbook#1224.
GATEWAY = {
    "error": {
        "message": "input contains sensitive words: [某敏感口号] (request id: 2024052315200716060)",
        "type": "new_api_error",
        "param": "",
        "code": "sensitive_words_detected",
    }
}
REFUSALS = {
    "zhipu-1301": ZHIPU_1301,
    "dashscope": DASHSCOPE,
    "dashscope-algo": DASHSCOPE_ALGO,
    "moonshot": MOONSHOT,
    "ark": ARK,
    "azure": AZURE,
    "deepseek": DEEPSEEK,
    "gateway": GATEWAY,
}


def refusing(body: dict[str, Any], otherwise: Reply | Callable[[dict[str, Any]], Reply]) -> Any:
    """The provider: a request whose body holds PHRASE gets the refusal, any other `otherwise`."""

    def answer(request: dict[str, Any]) -> Reply:
        if PHRASE in json.dumps(request, ensure_ascii=False):
            return Reply(status=400, raw=json.dumps(body, ensure_ascii=False))
        return otherwise if isinstance(otherwise, Reply) else otherwise(request)

    return answer


@pytest.fixture
async def client() -> Any:
    async def no_wait(_: float) -> None:
        pass

    client = LLMClient(timeout=5, sleep=no_wait)
    yield client
    await client.aclose()


# ---- 1. knowing a refusal of the input --------------------------------------------------------
@pytest.mark.parametrize("body", REFUSALS.values(), ids=REFUSALS.keys())
async def test_each_providers_input_review_refusal_is_known_as_one(
    client: LLMClient, llm: ScriptedLLM, body: dict[str, Any]
) -> None:
    llm.reset()
    llm.push(Reply(status=400, raw=json.dumps(body, ensure_ascii=False)))
    model = ModelConfig(**llm.model_config())
    with pytest.raises(LLMInputRefused) as caught:
        await client.chat(model, [{"role": "user", "content": "你好"}], purpose="对话")
    assert len(llm.requests) == 1  # refused for good: never retried, no parameter dropped
    assert caught.value.refused is None
    assert "内容审核" in in_chinese(caught.value)


async def test_minimax_sensitive_input_in_base_resp_is_an_input_refusal(
    client: LLMClient, llm: ScriptedLLM
) -> None:
    # MiniMax answers HTTP 200 with base_resp 1026 "input new_sensitive" (esengine/
    # DeepSeek-Reasonix#6818: "MiniMax 官方定义 1026 / input new_sensitive 为输入内容涉敏").
    from tests.test_audit8_z import minimax_error

    llm.reset()
    llm.push(Reply(raw=minimax_error(1026, "input new_sensitive")))
    model = ModelConfig(**llm.model_config())
    with pytest.raises(LLMInputRefused):
        await client.chat(model, [{"role": "user", "content": "你好"}], purpose="对话")


@pytest.mark.parametrize(
    ("status", "message"),
    [
        # A refused parameter (openai_max_tokens_400.json's words), a context too long (OpenAI,
        # Zhipu 1261), an output filter's words (Ark's OutputTextSensitiveContentDetected), rate
        # limits with a review-like word: none of them is a refusal of the input.
        (400, "Unsupported parameter: 'max_tokens' is not supported with this model."),
        (400, "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000"),
        (400, "Prompt exceeds max length"),
        (400, "The request failed because the output text may contain sensitive information."),
        (429, "The request was rejected because it was considered high risk"),
        (500, "Content Exists Risk"),
    ],
)
def test_an_input_refusal_is_never_confused_with_another_error(status: int, message: str) -> None:
    assert not is_input_refused(status, message)


def test_a_refusal_is_not_a_context_too_long() -> None:
    for body in REFUSALS.values():
        message = body["error"]["message"]
        assert is_input_refused(400, message), message
        assert not is_context_too_long(400, message)


async def test_a_refused_parameter_stays_a_plain_bad_request(client: LLMClient, llm: ScriptedLLM) -> None:
    llm.reset()
    llm.push(Reply(status=400, raw=transcript("openai_max_tokens_400.json")), Reply("好"))
    model = ModelConfig(**llm.model_config())
    result = await client.chat(model, [{"role": "user", "content": "你好"}], purpose="对话", max_tokens=9)
    assert result.content == "好"  # asked again without it: a refused parameter, as before


# ---- the search itself (pure, bounded) --------------------------------------------------------
async def search(n: int, culprits: set[int], limit: int = 24) -> tuple[list[int], int]:
    probes = 0

    async def refused(subset: Any) -> bool:
        nonlocal probes
        probes += 1
        return bool(culprits & set(subset))

    return await find_refused(list(range(n)), refused, limit=limit), probes


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 300])
async def test_one_culprit_costs_at_most_2_log2_n_plus_1_probes(n: int) -> None:
    for culprit in {0, n // 2, n - 1}:
        found, probes = await search(n, {culprit}, limit=1000)
        assert found == [culprit]
        assert probes <= 2 * math.ceil(math.log2(max(n, 1))) + 1


async def test_two_culprits_are_both_found() -> None:
    found, _ = await search(64, {5, 40})
    assert found == [5, 40]


async def test_a_combination_refused_only_together_finds_nothing() -> None:
    probes = 0

    async def refused(subset: Any) -> bool:
        nonlocal probes
        probes += 1
        return {3, 4} <= set(subset)

    assert await find_refused(list(range(8)), refused) == []
    assert probes <= 8


async def test_the_search_stops_at_its_limit_with_what_it_found() -> None:
    with pytest.raises(ProbeLimit) as stopped:
        await search(1024, {1, 500, 1000}, limit=12)
    assert stopped.value.found == [1]


# ---- 2. the summariser ------------------------------------------------------------------------
async def poisoned(env: Env, n: int = 20, at: int = 7, body: dict[str, Any] = DASHSCOPE) -> Message:
    """A group history of `n` lines where line `at` holds PHRASE; the provider refuses it."""
    env.model.summary_default = refusing(body, Reply(NOTHING_KEPT))
    env.model.chat_default = refusing(body, Reply("好的"))
    seeded = await seed(env.rt, n)
    bad = Message(role="user", content=f"[路人(30007)] 快来看 {PHRASE} 点这里", ts=1000.0 + at + 0.5)
    stored = await env.rt.agent.record(GROUP, bad)
    assert len(seeded) == n
    return stored


async def test_r_run_11_a_refused_message_no_longer_stops_the_compression(env: Env) -> None:
    bad = await poisoned(env)
    result = await env.rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    requests = env.model.summary_requests()
    final = requests[-1]
    assert PHRASE not in json.dumps(final, ensure_ascii=False)
    assert f"[路人(30007)] {REFUSED_TEXT}" in conversation_of(final)  # who spoke stays, not what
    # Bounded: the refused request, at most 2·⌈log2 21⌉ + 1 probes, and the request again.
    assert len(requests) <= 1 + 2 * math.ceil(math.log2(21)) + 1 + 1
    assert all(r["max_tokens"] <= 16 for r in requests[1:-1])  # probes ask for next to nothing
    # R-MEM-2: the text stays stored, marked; the owner and a later request know it.
    (stored,) = [m for m in await env.rt.store.get_archived(GROUP.id) if m.id == bad.id]
    assert is_refused(stored)
    assert PHRASE in stored.content
    warnings = [w for w in env.warnings if "content review refused" in w]
    assert len(warnings) == 1
    assert str(bad.id) in warnings[0]
    assert "[路人(30007)]" in warnings[0]
    assert PHRASE not in warnings[0]
    assert env.failure_warnings() == []
    assert env.phases()[-1] == ("done", None)


async def test_r_run_11_the_next_run_sends_the_placeholder_without_a_new_search(env: Env) -> None:
    bad = await poisoned(env, n=6, at=5)
    env.model.summary_default = refusing(DASHSCOPE, Reply("【保留原文】无\n## 最近在聊什么\n闲聊"))
    # A summary that keeps the refused line verbatim: it stays active, and the next run reads it.
    from tests.fakes.service import keeping

    env.model.summary.append(refusing(DASHSCOPE, keeping(REFUSED_TEXT)))
    first = await env.rt.compression.compress(GROUP.id)
    assert first.outcome == "done"
    before = len(env.model.summary_requests())
    await seed(env.rt, 4, start=100)
    again = await env.rt.compression.compress(GROUP.id)
    assert again.outcome == "done"
    later = env.model.summary_requests()[before:]
    assert len(later) == 1  # the placeholder went straight in: no refusal, no search
    assert PHRASE not in json.dumps(later[0], ensure_ascii=False)
    del bad


async def test_r_run_11_a_refused_existing_summary_fails_the_run_and_says_so(env: Env) -> None:
    env.model.summary_default = refusing(DASHSCOPE, Reply(NOTHING_KEPT))
    await env.rt.store.put_meta(
        "summary", GROUP.id, {**OLD_SUMMARY, "text": OLD_SUMMARY["text"] + f"\n{PHRASE}"}
    )
    await seed(env.rt, 6)
    with pytest.raises(CompressionError) as caught:
        await env.rt.compression.compress(GROUP.id)
    assert "已有摘要未通过模型服务商的内容审核" in str(caught.value)
    assert len(env.model.summary_requests()) == 2  # the run's request and one probe without the summary
    assert not any(is_refused(m) for m in await env.rt.store.get_history(GROUP.id))
    assert PHRASE in existing_summary_of(env.model.summary_requests()[0])
    assert (await summary_of(env.rt) or {})["text"].endswith(PHRASE)  # rolled back: untouched


async def test_r_run_11_refused_together_but_never_alone_fails_with_its_reason(env: Env) -> None:
    # A review that refuses two harmless halves only together (a combination): nothing to leave
    # out, so the run fails once with a reason the owner can read, and backs off as before.
    def answer(request: dict[str, Any]) -> Reply:
        text = json.dumps(request, ensure_ascii=False)
        if "第1句" in text and "第4句" in text:
            return Reply(status=400, raw=json.dumps(DEEPSEEK))
        return Reply(NOTHING_KEPT)

    env.model.summary_default = answer
    await seed(env.rt, 6)
    with pytest.raises(CompressionError) as caught:
        await env.rt.compression.compress(GROUP.id)
    assert "找不出是哪条消息" in str(caught.value)
    assert not any(is_refused(m) for m in await env.rt.store.get_history(GROUP.id))


@pytest.mark.parametrize("name", ["zhipu-1301", "moonshot", "ark", "azure", "deepseek", "gateway"])
async def test_r_run_1_every_providers_refusal_is_searched_and_left_out(env: Env, name: str) -> None:
    await poisoned(env, n=10, at=3, body=REFUSALS[name])
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    summary = await summary_of(env.rt)
    assert summary is not None
    assert PHRASE not in summary["text"]


async def test_r_mem_2_the_refused_mark_is_stored_on_both_engines(location: Path | str, make: Make) -> None:
    env = await make(location=location)
    bad = await poisoned(env, n=8, at=2)
    await env.rt.store.mark_refused(GROUP.id, [bad.id or 0])
    history = await env.rt.store.get_history(GROUP.id)
    (stored,) = [m for m in history if m.id == bad.id]
    assert is_refused(stored)
    assert stored.metadata[REFUSED_KEY] is True
    assert PHRASE in stored.content  # R-MEM-2: nothing deleted
    assert sum(is_refused(m) for m in history) == 1
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    sent = env.model.summary_requests()
    assert len(sent) == 1
    assert PHRASE not in json.dumps(sent[0], ensure_ascii=False)


# ---- 3. the chat turn -------------------------------------------------------------------------
APOLOGY = "抱歉，我这边出了点问题，请稍后再试。"


async def turn(env: Env, text: str, uid: int = 20002, name: str = "乙") -> tuple[str, list[str]]:
    """`name` asks the bot in the group; the outcome and what the group got."""
    await env.rt.agent.record(
        GROUP, Message(role="user", content=f"[{name}({uid})] @小记 {text}", name=str(uid), addressed=True)
    )
    sent: list[str] = []

    async def reply(out: str) -> None:
        sent.append(out)

    outcome = await env.rt.agent.run_turn(GROUP.id, reply, IN_GROUP, requested=True)
    return outcome, sent


async def test_a_refused_message_in_the_history_no_longer_fails_every_turn(env: Env) -> None:
    bad = await poisoned(env, n=6, at=3, body=ZHIPU_1301)
    outcome, sent = await turn(env, "今天晚上吃什么？")
    assert (outcome, sent) == ("replied", ["好的"])
    chats = env.model.chat_requests()
    final = json.dumps(chats[-1], ensure_ascii=False)
    assert PHRASE not in final
    assert f"[路人(30007)] {REFUSED_TEXT}" in final
    assert "今天晚上吃什么" in final
    # Bounded: the refused request, ≤ 2·⌈log2 8⌉ + 2 probes, and the request again.
    assert len(chats) <= 1 + 2 * 3 + 2 + 1
    (stored,) = [m for m in await env.rt.store.get_history(GROUP.id) if m.id == bad.id]
    assert is_refused(stored)
    assert PHRASE in stored.content  # R-MEM-2
    warnings = [w for w in env.warnings if "content review refused" in w]
    assert len(warnings) == 1
    assert f"{bad.id} [路人(30007)]" in warnings[0]
    assert PHRASE not in warnings[0]
    # The next turn sends the placeholder at once: one request, no refusal, no search.
    before = len(env.model.chat_requests())
    assert await turn(env, "那明天呢？") == ("replied", ["好的"])
    assert len(env.model.chat_requests()) == before + 1


async def test_the_refused_question_itself_gets_the_error_reply_and_later_turns_work(env: Env) -> None:
    env.model.chat_default = refusing(MOONSHOT, Reply("好的"))
    env.model.summary_default = refusing(MOONSHOT, Reply(NOTHING_KEPT))
    await seed(env.rt, 4)
    outcome, sent = await turn(env, f"你怎么看{PHRASE}？", uid=30007, name="路人")
    assert (outcome, sent) == ("error", [APOLOGY])
    history = await env.rt.store.get_history(GROUP.id)
    (asked,) = [m for m in history if PHRASE in m.content]
    assert is_refused(asked)
    before = len(env.model.chat_requests())
    assert await turn(env, "换个话题，周末去哪？") == ("replied", ["好的"])
    later = env.model.chat_requests()[before:]
    assert len(later) == 1
    assert PHRASE not in json.dumps(later[0], ensure_ascii=False)


async def test_a_clean_question_read_with_a_refused_one_is_still_answered(env: Env) -> None:
    # Two members ask before the turn reads the history; the provider refuses one question.
    # Before: both got the error reply. Now the refused one reads as the placeholder and the
    # other is answered; the refused one stays marked.
    env.model.chat_default = refusing(DEEPSEEK, Reply("周末去爬山吧"))
    env.model.summary_default = refusing(DEEPSEEK, Reply(NOTHING_KEPT))
    await seed(env.rt, 4)
    await env.rt.agent.record(
        GROUP,
        Message(role="user", content=f"[路人(30007)] @小记 你怎么看{PHRASE}？", name="30007", addressed=True),
    )
    assert await turn(env, "周末去哪？") == ("replied", ["周末去爬山吧"])
    history = await env.rt.store.get_history(GROUP.id)
    (asked,) = [m for m in history if PHRASE in m.content]
    assert is_refused(asked)
    final = json.dumps(env.model.chat_requests()[-1], ensure_ascii=False)
    assert PHRASE not in final
    assert REFUSED_TEXT in final


async def test_a_refused_summary_is_left_out_of_that_turn_and_said_in_the_log(env: Env) -> None:
    env.model.chat_default = refusing(AZURE, Reply("好的"))
    await env.rt.store.put_meta(
        "summary", GROUP.id, {**OLD_SUMMARY, "text": OLD_SUMMARY["text"] + f"\n{PHRASE}"}
    )
    await seed(env.rt, 3)
    assert await turn(env, "还记得上周聊了什么吗？") == ("replied", ["好的"])
    final = json.dumps(env.model.chat_requests()[-1], ensure_ascii=False)
    assert PHRASE not in final
    assert "上周的旧话题" not in final  # the whole summary, for this turn
    assert any("goes without the summary" in w for w in env.warnings)
    assert not any(is_refused(m) for m in await env.rt.store.get_history(GROUP.id))


async def test_a_refused_persona_still_fails_the_turn_with_the_error_reply(env: Env) -> None:
    # The owner's persona (or another plugin's part) is what is refused: nothing in the history
    # can be left out, so the turn fails as before and nothing is marked.
    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    await env.rt.settings.set("persona", "session", GROUP.id, f"你是{PHRASE}的助手")
    await seed(env.rt, 3)
    assert await turn(env, "在吗？") == ("error", [APOLOGY])
    assert not any(is_refused(m) for m in await env.rt.store.get_history(GROUP.id))
    assert len(env.model.chat_requests()) == 2  # the turn's request and one probe of the history


async def test_r_run_1_a_message_the_chat_marked_reaches_the_summariser_as_the_placeholder(env: Env) -> None:
    await poisoned(env, n=6, at=2, body=DASHSCOPE)
    assert (await turn(env, "大家好"))[0] == "replied"
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    sent = env.model.summary_requests()
    assert len(sent) == 1  # no refusal, no search: the mark was already there
    assert f"[路人(30007)] {REFUSED_TEXT}" in conversation_of(sent[0])


# ---- the whole bot: a group, a refused member's message, another member's question ------------
@pytest.mark.e2e
async def test_r_run_11_bot_answers_and_compresses_a_group_holding_a_refused_message(tmp_path: Path) -> None:
    from tests.fakes.e2e import SELF_ID, group_sid, query, running_bot, wait_rows
    from tests.fakes.onebot import SEND_ACTIONS, at, text

    def answer(body: dict[str, Any]) -> Reply:
        if str(body["messages"][0].get("content") or "").startswith("你是对话摘要员"):
            return Reply(
                "【保留原文】无\n## 最近在聊什么\n有人问晚饭\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
            )
        return Reply("吃火锅吧。")

    group, sid = 95180, group_sid(95180)
    with ScriptedLLM() as llm:
        llm.on_request(refusing(DEEPSEEK, answer))
        settings = {
            "MEMSUM_MODELS": json.dumps([llm.model_config()]),
            "MEMSUM_WEB_TOKEN": WEB_TOKEN,
            "LOG_LEVEL": "INFO",
        }
        async with running_bot(tmp_path, settings) as (bot, sim):
            await sim.group_message(group, 20041, f"快来看 {PHRASE} 点这里")
            await wait_rows(bot, sid, 1)
            mark = len(sim.calls)
            await sim.group_message(group, 20042, [at(SELF_ID), text(" 今晚吃什么？")])
            await sim.wait_call(set(SEND_ACTIONS), after=mark, timeout=30)
            mark = len(sim.calls)
            await sim.group_message(group, 10001, "/压缩")
            await sim.wait_call(set(SEND_ACTIONS), after=mark, timeout=30)
            texts = sim.sent_texts()
            stored = await query(
                bot.db_path,
                "SELECT content, metadata FROM messages WHERE session_id = ? AND role = 'user'",
                sid,
            )
            summary = await query(
                bot.db_path, "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", sid
            )
            log = bot.log()
            base = f"http://127.0.0.1:{bot.port}/memsum"
            async with httpx.AsyncClient(base_url=base, timeout=10) as owner:
                assert (await owner.post("/api/login", json={"token": WEB_TOKEN})).status_code == 200
                page = await owner.get(f"/api/sessions/{sid}/search", params={"q": "快来看"})
                [hit] = page.json()["results"]
    assert texts[0] == "吃火锅吧。"  # not MEMSUM_ERROR_REPLY
    assert texts[1].startswith("压缩完成"), texts[1]
    refused = [json.loads(meta or "{}").get(REFUSED_KEY) for content, meta in stored if PHRASE in content]
    assert refused == [True]  # R-MEM-2: kept as said, marked
    assert PHRASE not in summary[0][0]
    summaries = [b for b in llm.requests if str(b["messages"][0]["content"]).startswith("你是对话摘要员")]
    assert len(summaries) == 1  # the chat turn had marked it: the summariser never saw the text
    assert f"{REFUSED_TEXT}" in conversation_of(summaries[0])
    assert PHRASE not in json.dumps(llm.requests[-1], ensure_ascii=False)
    assert "content review refused message(s)" in log
    # The owner's page shows the text as said, marked (R-MEM-2).
    assert hit["hit"]["content"] == f"[用户20041(20041)] 快来看 {PHRASE} 点这里"
    assert hit["hit"]["refused"] is True
    assert PHRASE not in log.split("content review refused message(s)", 1)[1].split("\n", 1)[0]


async def test_the_recall_tool_hands_the_model_the_placeholder_not_the_refused_text(env: Env) -> None:
    # A refused message found again by the model's recall tool would go back into the next
    # request as a tool result, and be refused there: the tool shows who said it, not what.
    from nonebot_plugin_memsum.agent.tools import ToolContext

    bad = await poisoned(env, n=6, at=2)
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    found = await env.rt.agent.tools.call(ToolContext(GROUP.id), "recall", json.dumps({"query": "快来看"}))
    assert f"[路人(30007)] {REFUSED_TEXT}" in found
    assert PHRASE not in found
    (stored,) = [m for m in await env.rt.store.get_archived(GROUP.id) if m.id == bad.id]
    assert PHRASE in stored.content


async def test_r_run_4_a_refused_todo_list_fails_the_run_without_marking_any_message(env: Env) -> None:
    # Every probe carries the work template's todo list: when that is what is refused, no message
    # may be marked for it (each probe would be refused, and every message looked guilty).
    from nonebot_plugin_memsum.agent.tools import TodoItem
    from tests.fakes.service import PRIVATE_OWNER

    assert env.rt.todos is not None
    env.model.summary_default = refusing(ARK, Reply(NOTHING_KEPT))
    await env.rt.todos.replace(PRIVATE_OWNER.id, [TodoItem(f"查{PHRASE}", "pending")])
    await seed(env.rt, 6, record=PRIVATE_OWNER)
    with pytest.raises(CompressionError) as caught:
        await env.rt.compression.compress(PRIVATE_OWNER.id)
    assert "任务列表未通过模型服务商的内容审核" in str(caught.value)
    assert not any(is_refused(m) for m in await env.rt.store.get_history(PRIVATE_OWNER.id))
    assert len(env.model.summary_requests()) == 2  # the run's request and one probe without any message


async def test_a_refused_message_counts_as_its_placeholder_in_the_prompt_estimate(env: Env) -> None:
    # A long spam wall, refused: its stored estimate is of the text, which no request carries any
    # more; the prompt's estimate (the compression line, hard trimming) counts the placeholder.
    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    wall = Message(role="user", content=f"[路人(30007)] {PHRASE}" + "刷屏广告" * 800, ts=999.0)
    await env.rt.agent.record(GROUP, wall)
    before = (await env.rt.agent.build_prompt(GROUP.id, IN_GROUP, with_tools=False)).estimate
    assert await turn(env, "在吗？") == ("replied", ["好的"])
    after = (await env.rt.agent.build_prompt(GROUP.id, IN_GROUP, with_tools=False)).estimate
    assert after < before - 1000  # the wall's ~2,000 tokens are gone from the estimate
