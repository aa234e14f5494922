"""NoneBot is initialised and the plugin loaded before collection, so test modules may
import the package at module level; nonebug's own init fixture is replaced by this one,
and its session lifespan starts the plugin against a temporary database."""

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nonebot
import pytest
from nonebot.adapters.onebot.v11 import Adapter as OneBotV11Adapter
from nonebug import App

from tests.fakes.llm_server import ScriptedLLM

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nonebot_plugin_memsum.store import Store
    from tests.fakes.agent import MakeRuntime
    from tests.fakes.pgserver import PgServer
    from tests.fakes.service import Env, Make

_TMP = Path(tempfile.mkdtemp(prefix="memsum-tests-"))
INIT_KWARGS = {
    "driver": "~fastapi",
    "superusers": {"10001"},
    "nickname": {"小记"},
    "command_start": {"/"},
    "memsum_db_path": str(_TMP / "plugin.db"),
    # nonebug expects every API call a test makes: no history fetch or resumed answer on
    # connect here (tests/test_crash_e2e.py covers them through a real bot process).
    "memsum_backfill_count": 0,
    "memsum_resume_window": 0,
    "localstore_data_dir": str(_TMP / "data"),
    "localstore_cache_dir": str(_TMP / "cache"),
    "localstore_config_dir": str(_TMP / "config"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`e2e`: every test of a `*_e2e.py` module (they run bot.py as a subprocess);
    `crash`: the SIGKILL tests. `pytest -m "not e2e and not crash"` is the fast unit loop."""
    for item in items:
        name = item.path.name
        if name.endswith("_e2e.py"):
            item.add_marker(pytest.mark.e2e)
        if "crash" in name:
            item.add_marker(pytest.mark.crash)


def pytest_configure(config: pytest.Config) -> None:
    from nonebot.matcher import matchers
    from nonebug.provider import NoneBugProvider

    nonebot.init(**INIT_KWARGS)
    matchers.set_provider(NoneBugProvider)
    nonebot.get_driver().register_adapter(OneBotV11Adapter)
    nonebot.load_plugin("nonebot_plugin_memsum")


@pytest.fixture(scope="session", autouse=True)
def _nonebot_init() -> None:
    """Overrides nonebug's: NoneBot was initialised in pytest_configure."""


ENGINES = ("sqlite", "postgresql")


@pytest.fixture(params=ENGINES)
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Path | str]:
    """Where a test's store lives, once per engine: a file in tmp_path, or a fresh
    PostgreSQL database (tests/fakes/pgdb.py)."""
    if request.param == "sqlite":
        yield tmp_path / "data" / "memsum.db"
        return
    from tests.fakes.pgdb import fresh_database

    server: PgServer = request.getfixturevalue("pg_server")  # tests/fakes/pgserver.py
    async with fresh_database(server.url()) as url:
        yield url


@pytest.fixture
async def store(location: Path | str) -> "AsyncIterator[Store]":
    """A store open on `location` (each engine), closed after the test; a module may define its own."""
    from nonebot_plugin_memsum.store import Store

    s = Store(location)
    await s.open()
    yield s
    await s.close()


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    """A scripted model server of the module's own; a module may define its own `llm`."""
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def admin_option(app: App, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """MEMSUM_GROUP_ADMIN_COMMANDS for one test (indirect parameter; default off)."""
    from nonebot_plugin_memsum import runtime

    value = bool(getattr(request, "param", False))
    rt = runtime.get()
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_group_admin_commands": value}))
    return value


@pytest.fixture
async def make_rt(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator["MakeRuntime"]:
    """The agent tests' private runtimes on a fresh database; `model={...}` overrides the
    model's fields, other keywords the Config's."""
    from nonebot_plugin_memsum import runtime
    from nonebot_plugin_memsum.config import Config, ModelConfig
    from nonebot_plugin_memsum.runtime import Runtime
    from tests.fakes.agent import MODEL_ID, PERSONA, summaries_only

    built: list[Runtime] = []

    async def make(model: dict[str, Any] | None = None, **config: Any) -> Runtime:
        models = [ModelConfig(**llm.model_config(MODEL_ID, **(model or {})))]
        cfg = Config(memsum_models=models, memsum_persona=PERSONA, **config)
        rt = await runtime.build(cfg, tmp_path / f"memsum-{len(built)}.db", ["小记"], {"10001"})
        built.append(rt)
        return rt

    llm.reset()
    llm.on_request(summaries_only)
    try:
        yield make
    finally:
        for rt in built:
            await runtime.close(rt)
        llm.reset()


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator["Make"]:
    """The compression service tests' private runtimes: a chat model and a summary model
    (the summary preference) on one server."""
    from nonebot.log import logger

    from nonebot_plugin_memsum import runtime
    from nonebot_plugin_memsum.agent.events import CompressionProgress
    from nonebot_plugin_memsum.config import Config
    from tests.fakes.service import CHAT_MODEL, OWNER, SUMMARY_MODEL, Env, Model

    built: list[tuple[Env, ScriptedLLM, int]] = []

    async def build(
        *,
        chat: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
        models: "Callable[[ScriptedLLM], list[dict[str, Any]]] | None" = None,
        location: Path | str | None = None,
        **config: Any,
    ) -> "Env":
        llm = ScriptedLLM().start()
        model = Model(llm)
        if models is None:
            entries = [
                llm.model_config(CHAT_MODEL, priority=1, **(chat or {})),
                llm.model_config(SUMMARY_MODEL, **(summary or {})),
            ]
        else:
            entries = models(llm)
        cfg = Config.model_validate(
            {
                "memsum_models": entries,
                "memsum_chat_model": CHAT_MODEL,
                "memsum_summary_model": SUMMARY_MODEL,
                **config,
            }
        )
        rt = await runtime.build(cfg, location or tmp_path / f"memsum-{len(built)}.db", [], {OWNER})
        progress: list[CompressionProgress] = []
        rt.bus.subscribe(CompressionProgress, progress.append)
        warnings: list[str] = []
        sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
        env = Env(rt, model, progress, warnings)
        built.append((env, llm, sink))
        return env

    yield build
    for env, llm, sink in built:
        for g in env.model.gates:
            g.open()
        await runtime.close(env.rt)
        logger.remove(sink)
        llm.stop()


@pytest.fixture
async def env(make: "Make") -> "Env":
    return await make()


@pytest.fixture
async def library(make: "Make", monkeypatch: pytest.MonkeyPatch) -> "Callable[..., Awaitable[Env]]":
    """`make`, with the runtime it builds the one `api` answers for (tests that drive the
    product only through the library API)."""
    from nonebot_plugin_memsum import runtime

    async def build(**kw: Any) -> "Env":
        env = await make(**kw)
        monkeypatch.setattr(runtime, "_current", env.rt)
        return env

    return build


@pytest.fixture(scope="session")
def pg_server() -> Iterator["PgServer"]:
    """One private PostgreSQL server for the whole run (tests/fakes/pgserver.py)."""
    from tests.fakes.pgserver import PgServer

    with PgServer() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: "PgServer") -> Iterator[str]:
    """A fresh empty database on the test server, dropped after the test; its URL."""
    url = pg_server.database()
    yield url
    pg_server.drop(url)
