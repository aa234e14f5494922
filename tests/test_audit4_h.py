"""Fourth outside audit (h): configuration, providers' failures and secrets, as an owner breaks them.

Start-up is judged through bot.py as a subprocess; model calls through the real httpx client
against the scripted OpenAI-compatible server on 127.0.0.1 (tests/fakes/llm_server.py).
"""

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from nonebot_plugin_memsum.config import ConfigError, ModelConfig, parse_config
from nonebot_plugin_memsum.llm.client import LLMClient
from nonebot_plugin_memsum.llm.errors import LLMBadResponse, LLMConnectError
from tests.fakes.botproc import REPO, BotExitedError, BotProcess
from tests.fakes.e2e import connected, wait_log
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.onebot import SEND_ACTIONS

MESSAGES = [{"role": "user", "content": "[小明(12345)] 在吗？"}]
PROXY_VARIABLES = (
    "NO_PROXY",
    "no_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


@pytest.fixture(scope="module")
def llm() -> Any:
    with ScriptedLLM() as server:
        yield server


# ---- API keys as owners paste them ----------------------------------------------------------
@pytest.mark.parametrize("pasted", [API_KEY + "\n", f"  {API_KEY}  ", f"\t{API_KEY}\r\n"])
async def test_an_api_key_pasted_with_a_line_break_or_spaces_around_it_still_answers(
    llm: ScriptedLLM, pasted: str
) -> None:
    # Before: every request failed with "Illegal header value b'Bearer sk-…\n'", the key in the log.
    llm.reset()
    model = ModelConfig.model_validate(llm.model_config(api_key=pasted))
    client = LLMClient(timeout=10, max_retries=0)
    try:
        with captured("DEBUG") as logs:
            result = await client.chat(model, MESSAGES, purpose="chat")
    finally:
        await client.aclose()
    assert result.content == "好的"
    assert llm.request_headers[-1]["authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in "\n".join(logs)


async def test_an_api_key_env_variable_with_a_trailing_newline_is_trimmed(
    llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `export DEEPSEEK_KEY="$(cat key.txt)"` keeps the newline when the file has two.
    monkeypatch.setenv("MEMSUM_AUDIT_KEY", API_KEY + "\n")
    config = {**llm.model_config(api_key_env="MEMSUM_AUDIT_KEY")}
    del config["api_key"]
    model = ModelConfig.model_validate(config)
    assert model.api_key.get_secret_value() == API_KEY


@pytest.mark.parametrize(
    "key",
    [
        "sk-abc def123",  # a space inside: two words pasted
        "sk-abc１２３",  # full-width digits from a Chinese page
        "sk-abc\r\nX-Injected: 1",  # a header injection
        "sk-abc\u200bdef",  # a zero-width space copied from a web page
    ],
)
def test_an_api_key_no_http_header_can_carry_is_refused_naming_the_key_not_its_value(key: str) -> None:
    model = {
        "id": "deepseek/deepseek-chat",
        "base_url": "https://api.deepseek.com/v1",
        "context_window": 65536,
    }
    with pytest.raises(ConfigError) as info:
        parse_config({"memsum_models": [{**model, "api_key": key}]})
    message = str(info.value)
    assert message.startswith("invalid MEMSUM_MODELS[0]")
    assert "api_key" in message
    assert "sk-abc" not in message
    assert "\n" not in message


async def test_a_full_width_api_key_stops_bot_py_with_one_line_and_no_key(tmp_path: Path) -> None:
    # Before: start-up went on, and every message then failed with UnicodeEncodeError, a
    # non-LLM error escaping the model layer.
    secret = "sk-live-７f3a9c"
    model = {"id": "p/m", "base_url": "http://127.0.0.1:9/v1", "api_key": secret, "context_window": 8000}
    bot = BotProcess(
        tmp_path, env={"MEMSUM_MODELS": json.dumps([model], ensure_ascii=False)}, log_level="INFO"
    )
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    log = exited.value.log
    assert exited.value.returncode != 0
    naming = [line for line in log.splitlines() if "MEMSUM_MODELS" in line]
    assert len(naming) == 1, log
    assert "api_key" in naming[0]
    assert "Traceback" not in log
    assert "sk-live" not in log
    assert "７f3a9c" not in log


# ---- The shipped .env.example ------------------------------------------------------------------
class _ExampleBot(BotProcess):
    """bot.py with the repository's .env.example as its .env, only the port changed."""

    def _write_dotenv(self) -> None:
        text = (REPO / ".env.example").read_text(encoding="utf-8")
        text, n = re.subn(r"(?m)^PORT=\d+$", f"PORT={self.port}", text)
        assert n == 1
        (self.workdir / ".env").write_text(text, encoding="utf-8")


async def test_the_shipped_env_example_starts_warns_of_and_never_prints_its_placeholder_key(
    tmp_path: Path,
) -> None:
    bot = _ExampleBot(tmp_path)
    try:
        await bot.start()
    finally:
        code = await bot.stop()
    log = bot.log()
    assert code == 0, log
    assert "Application startup complete" in log
    assert "Traceback" not in log
    assert "sk-your-key" not in log
    # Audit 17: started as the quick start leaves it, it says the key is still the example's
    # (every question then failed with the provider's 401, with no word at start-up).
    assert "deepseek/deepseek-chat still has the example api_key of .env.example" in log


# ---- Numbers that are not numbers ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "key"),
    [
        # "inf" reaches us as text (not JSON), "Infinity" / "NaN" decoded by NoneBot's json.loads.
        ({"memsum_llm_timeout": "inf"}, "MEMSUM_LLM_TIMEOUT"),
        ({"memsum_llm_timeout": float("inf")}, "MEMSUM_LLM_TIMEOUT"),
        ({"memsum_user_cooldown": "Infinity"}, "MEMSUM_USER_COOLDOWN"),
        ({"memsum_resume_window": float("inf")}, "MEMSUM_RESUME_WINDOW"),
        (
            {
                "memsum_models": [
                    {"id": "p/m", "base_url": "http://h/v1", "context_window": 8, "price_out": 1e999}
                ]
            },
            "MEMSUM_MODELS[0][price_out]",
        ),
    ],
)
def test_an_infinite_timeout_cooldown_window_or_price_stops_start_up_naming_the_key(
    raw: dict[str, Any], key: str
) -> None:
    # Before: MEMSUM_LLM_TIMEOUT=inf let a stalled provider hold a turn for ever, a cooldown of
    # inf answered each member once in the bot's life, an infinite price showed "inf 元".
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith(f"invalid {key}: ")
    assert "finite" in str(info.value)


# ---- Bodies that are no event stream ------------------------------------------------------------
@asynccontextmanager
async def _http_server(ctype: str, body: bytes) -> AsyncIterator[str]:
    """A real HTTP/1.1 server on 127.0.0.1 answering every request 200 with `body`; its base URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: "
            + ctype.encode()
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


# songquanpeng/one-api router/web-router.go, SetWebRouter: `router.NoRoute` answers any path not
# under /v1 with `c.Data(http.StatusOK, "text/html; charset=utf-8", indexPage)`. A base_url
# written without /v1 (https://oneapi.example.com) so gets the console's index page, status 200.
ONE_API_INDEX = (
    b'<!doctype html><html lang="zh"><head><meta charset="utf-8"/><title>One API</title>'
    b'<script defer="defer" src="/static/js/main.js"></script></head><body>'
    b'<noscript>You need to enable JavaScript to run this app.</noscript><div id="root"></div></body></html>'
)


async def test_a_base_url_without_v1_that_reaches_a_web_console_is_named_not_called_a_cut_stream() -> None:
    # Before: LLMStreamCut "stream ended early (no finish reason, no [DONE])", which sends the
    # owner after the network instead of the base_url.
    async with _http_server("text/html; charset=utf-8", ONE_API_INDEX) as root:
        model = ModelConfig(
            id="oneapi/deepseek-chat", base_url=root, api_key=SecretStr(API_KEY), context_window=65536
        )
        client = LLMClient(timeout=10, max_retries=0)
        try:
            with pytest.raises(LLMBadResponse) as info:
                await client.chat(model, MESSAGES, purpose="chat")
        finally:
            await client.aclose()
    message = str(info.value)
    assert message.startswith("oneapi/deepseek-chat: ")
    assert "text/html" in message
    assert "base_url" in message
    assert "One API" in message
    assert API_KEY not in message


# A server that ignores `stream: true` and answers one plain completion: reported of upstreams
# in tinyhumansai/tinyagents PR #56 ("stream() JSON fallback when upstream ignores stream:true").
# The body is OpenAI's documented chat completion object (platform.openai.com/docs/api-reference/
# chat/object), with DeepSeek's usage fields (api-docs.deepseek.com/api/create-chat-completion).
PLAIN_COMPLETION = json.dumps(
    {
        "id": "930c60df-bf64-41c9-a88e-3ec75f81e00e",
        "object": "chat.completion",
        "created": 1705651092,
        "model": "deepseek-chat",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "在的，有什么事？"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 16,
            "completion_tokens": 10,
            "total_tokens": 26,
            "prompt_cache_hit_tokens": 0,
            "prompt_cache_miss_tokens": 16,
        },
    },
    ensure_ascii=False,
).encode()


async def test_a_server_ignoring_stream_true_is_answered_from_its_plain_completion() -> None:
    # Before: every streamed call failed as a cut stream, and every message got the apology.
    async with _http_server("application/json", PLAIN_COMPLETION) as root:
        model = ModelConfig(id="local/deepseek-chat", base_url=root + "/v1", context_window=65536)
        client = LLMClient(timeout=10, max_retries=0)
        try:
            result = await client.chat(model, MESSAGES, purpose="chat", stream=True)
        finally:
            await client.aclose()
    assert result.content == "在的，有什么事？"
    assert result.finish_reason == "stop"
    assert result.usage is not None
    assert result.usage.prompt_tokens == 16


async def test_a_json_error_sent_with_200_to_a_stream_is_shown_not_called_a_cut() -> None:
    # SiliconFlow's documented error body (docs.siliconflow.cn/faqs/error-code, sent there with
    # 400), here as a relay that answers every request 200 would pass it on.
    body = b'{"code":20012,"message":"Model does not exist. Please check it carefully.","data":null}'
    async with _http_server("application/json", body) as root:
        model = ModelConfig(
            id="sf/deepseek-v3", base_url=root + "/v1", api_key=SecretStr(API_KEY), context_window=65536
        )
        client = LLMClient(timeout=10, max_retries=0)
        try:
            with pytest.raises(LLMBadResponse) as info:
                await client.chat(model, MESSAGES, purpose="chat")
        finally:
            await client.aclose()
    assert "Model does not exist" in str(info.value)


# ---- base_url as owners paste it ------------------------------------------------------------------
def test_a_base_url_copied_with_chat_completions_from_a_curl_example_stops_start_up_naming_it() -> None:
    # DeepSeek's quick start (api-docs.deepseek.com) shows `curl https://api.deepseek.com/chat/completions`;
    # the client appends /chat/completions, so every request would go to …/chat/completions/chat/completions.
    model = {"id": "deepseek/deepseek-chat", "base_url": "https://api.deepseek.com/chat/completions/"}
    with pytest.raises(ConfigError) as info:
        parse_config({"memsum_models": [{**model, "api_key": "sk-abc", "context_window": 65536}]})
    message = str(info.value)
    assert message.startswith("invalid MEMSUM_MODELS[0][base_url]: ")
    assert "without /chat/completions" in message


async def test_a_base_url_with_a_line_break_or_spaces_around_it_still_answers(llm: ScriptedLLM) -> None:
    # Before: a trailing newline raised httpx.InvalidURL, no model error, at every message.
    llm.reset()
    config = llm.model_config()
    model = ModelConfig.model_validate({**config, "base_url": f" {config['base_url']}/\n"})
    client = LLMClient(timeout=10, max_retries=0)
    try:
        result = await client.chat(model, MESSAGES, purpose="chat")
    finally:
        await client.aclose()
    assert result.content == "好的"


def test_a_base_url_with_a_space_inside_is_refused_naming_it() -> None:
    model = {"id": "p/m", "base_url": "https://api.deepseek.com /v1", "context_window": 8000}
    with pytest.raises(ConfigError, match=re.escape("invalid MEMSUM_MODELS[0][base_url]: ")):
        parse_config({"memsum_models": [model]})


# ---- A wrong key, through the whole bot ----------------------------------------------------------
# OpenAI's documented 401 (platform.openai.com/docs/guides/error-codes, "401 - Incorrect API key
# provided"): {"error": {"message": "Incorrect API key provided: sk-…", "type":
# "invalid_request_error", "param": null, "code": "invalid_api_key"}}; here echoing the whole key,
# as some relays do instead of OpenAI's masked form.
WRONG_KEY_BODY = json.dumps(
    {
        "error": {
            "message": f"Incorrect API key provided: {API_KEY}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
)


async def test_a_wrong_key_gets_a_short_chinese_apology_and_no_secret_reaches_chat_or_log(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    llm.reset()
    llm.on_request(lambda body: Reply(status=401, raw=WRONG_KEY_BODY))
    onebot_token = "onebot-token-Qx7vR2mZ"
    web_token = "web-token-8hJ3kL0pW5sD2fG"
    env = {
        "MEMSUM_MODELS": json.dumps([llm.model_config("openai/gpt-4o-mini")]),
        "MEMSUM_WEB_TOKEN": web_token,
    }
    bot = BotProcess(tmp_path, env=env, access_token=onebot_token, log_level="INFO")
    async with bot, connected(bot) as sim:
        await sim.private_message(10001, "你好，在吗？")
        apology = await sim.wait_call(set(SEND_ACTIONS))
        await wait_log(bot, "memsum: turn ")
        before = len(sim.calls)
        await sim.private_message(10001, "/用量")
        await sim.wait_call(set(SEND_ACTIONS), after=before)
        before = len(sim.calls)
        await sim.private_message(10001, "/摘要")
        await sim.wait_call(set(SEND_ACTIONS), after=before)
        texts = sim.sent_texts()
    log = bot.log()
    assert len(texts) == 3
    assert texts[0] == "抱歉，我这边出了点问题，请稍后再试。", apology
    failed = [line for line in log.splitlines() if "failed" in line and "openai/gpt-4o-mini" in line]
    assert failed, log
    assert any("401" in line for line in failed)
    for secret in (API_KEY, onebot_token, web_token):
        assert secret not in log
        assert not any(secret in t for t in texts), texts
    assert "Traceback" not in log


# ---- A PostgreSQL password with a character URLs reserve -------------------------------------------
async def test_a_db_password_with_a_bare_slash_and_at_stops_start_up_without_showing_any_of_it(
    tmp_path: Path,
) -> None:
    # Password `p@ss/w0rd` written as is: the URL's host part ended at the `/`, the config took
    # host `ss` and path `/w0rd@127.0.0.1:1/memsum`, and start-up logged "cannot connect to
    # postgresql://memsum@ss/w0rd@…", most of the password.
    url = "postgresql://memsum:p@ss/w0rd@127.0.0.1:1/memsum"
    bot = BotProcess(tmp_path, env={"MEMSUM_DB_URL": url}, log_level="INFO")
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    log = exited.value.log
    lines = [line for line in log.splitlines() if "MEMSUM_DB_URL" in line]
    assert len(lines) == 1, log
    assert "%40" in lines[0]
    assert "%2F" in lines[0]
    assert "w0rd" not in log
    assert "Traceback" not in log


# ---- The environment's proxy ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "proxy"),
    [("ALL_PROXY", "socks5://127.0.0.1:9"), ("HTTPS_PROXY", "ftp://me:Proxy-Pass-77@127.0.0.1:9")],
)
async def test_a_socks_proxy_in_the_environment_fails_as_a_model_error_naming_the_proxy(
    monkeypatch: pytest.MonkeyPatch, name: str, proxy: str
) -> None:
    # Clash / v2ray users export ALL_PROXY=socks5://127.0.0.1:7890; httpx reads it and, without
    # the optional socksio package, raised ImportError out of the model layer at every message
    # (a traceback per turn instead of one model error).
    for other in PROXY_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    # A proxy URL httpx cannot use raised ValueError quoting it, password and all.
    monkeypatch.setenv(name, proxy)
    model = ModelConfig(
        id="deepseek/deepseek-chat",
        base_url="https://api.deepseek.com/v1",
        api_key=SecretStr(API_KEY),
        context_window=65536,
    )
    client = LLMClient(timeout=10, max_retries=0)
    try:
        with pytest.raises(LLMConnectError) as info:
            await client.chat(model, MESSAGES, purpose="chat")
    finally:
        await client.aclose()
    assert str(info.value).startswith("deepseek/deepseek-chat: ")
    assert "proxy" in str(info.value)
    assert API_KEY not in str(info.value)
    assert "Proxy-Pass-77" not in str(info.value)


@asynccontextmanager
async def _forwarding_proxy() -> AsyncIterator[tuple[str, list[bytes]]]:
    """An HTTP forward proxy on 127.0.0.1, as Clash's or Squid's HTTP port: a plain-http target
    comes as an absolute-form request line (RFC 9112 §3.2.2), which it notes and pipes, with
    the rest of the connection, to the host that line names."""
    lines: list[bytes] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.readline()
        lines.append(first)
        host, port = re.match(rb"[A-Z]+ http://([^:/]+):(\d+)/", first).groups()  # type: ignore[union-attr]
        up_reader, up_writer = await asyncio.open_connection(host.decode(), int(port))
        up_writer.write(first)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", lines
    finally:
        server.close()


@pytest.mark.parametrize("name", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
async def test_the_model_is_reached_through_the_proxy_of_the_environment(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # README (配置): a model behind a proxy is reached by exporting HTTP(S)_PROXY / ALL_PROXY, and
    # NO_PROXY names the hosts reached directly (a local Ollama beside a proxied provider).
    for other in PROXY_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    with ScriptedLLM() as llm:
        llm.push(Reply("经代理"), Reply("直连"))
        model = ModelConfig.model_validate(llm.model_config())
        url = f"{llm.base_url}/chat/completions".encode()
        async with _forwarding_proxy() as (proxy, lines):
            monkeypatch.setenv(name, proxy)
            client = LLMClient(timeout=10, max_retries=0)
            try:
                through = await client.chat(model, MESSAGES, purpose="chat")
            finally:
                await client.aclose()
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            client = LLMClient(timeout=10, max_retries=0)
            try:
                direct = await client.chat(model, MESSAGES, purpose="chat")
            finally:
                await client.aclose()
    assert (through.content, direct.content) == ("经代理", "直连")
    assert [line.split()[1] for line in lines] == [url]
    assert len(llm.requests) == 2
