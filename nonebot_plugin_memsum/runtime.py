"""What the plugin runs once started: one store, one HTTP client, one agent, one bus,
and the OneBot layer's bounded state.

Created in NoneBot's on_startup and stopped in on_shutdown (both idempotent); importing
the plugin opens nothing.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from nonebot.log import logger

from .agent.events import EventBus
from .agent.recall import RECALL_TOOL, mask_withdrawn, register_recall_tool
from .agent.tools import (
    TODO_TOOL,
    StoreTodoProvider,
    TodoProvider,
    ToolContext,
    ToolRegistry,
    offer_todo_tool,
    register_todo_tool,
)
from .agent.turn import Agent
from .compression.service import CompressionService
from .config import DEFAULT_PERSONA, Config
from .controls import Controls
from .errors import ConfigError, NotStarted, StoreError
from .llm import LLMClient, Registry
from .llm.tokens import aload_encoding, encoding_name, estimate_text_tokens
from .onebot.state import OneBotState
from .settings import Settings
from .store import Location, Store, open_store
from .usage import zone_of


@dataclass
class Runtime:
    config: Config
    store: Store
    registry: Registry
    client: LLMClient
    bus: EventBus
    settings: Settings
    tools: ToolRegistry
    todos: StoreTodoProvider
    """The built-in todo list (in the store); `use_todos` puts another plugin's in its place."""
    agent: Agent
    compression: CompressionService
    controls: Controls
    nicknames: list[str] = field(default_factory=list)
    onebot: OneBotState = field(default_factory=OneBotState)
    """Names, arrival tickets and recording locks of the OneBot layer, bounded."""
    indexing: asyncio.Task[None] | None = None
    """Keeps the search index in step with the messages (store/search.py)."""

    async def mark_withdrawn(self, session_id: str, platform_id: str) -> None:
        """`Store.mark_withdrawn`, with the session's recall results that show those messages
        masked as the recall tool wrote them (its time zone)."""
        mask = functools.partial(mask_withdrawn, zone=zone_of(self.config))
        await self.agent.mark_withdrawn(session_id, platform_id, mask)

    def use_todos(self, provider: TodoProvider | None) -> None:
        """The todo list the work template reads (R-RUN-4, the spec's todoList) and the built-in
        `todo_write` tool writes: another plugin's, or none (then the summary input carries no
        task list and the tool is not offered). A `todo_write` of another plugin stays as it is."""
        self.compression.todos = provider
        offer_todo_tool(self.tools, provider)


Step = Callable[[Runtime], object]


class Pending:
    """Other plugins' registrations (tools, listeners, contributions, a todo list) made
    before NoneBot started the runtime: at their import, where NoneBot plugins register
    their matchers. Kept for the process, and applied in order to every runtime `start`
    builds (tests start and stop several)."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.tools = ToolRegistry()
        """The tool names the kept steps leave taken, beside the built-in ones: a taken name
        raises at the registering call, as after start. Its functions never run."""
        for name in (RECALL_TOOL, TODO_TOOL):
            self.tools.tool(name, name, {"type": "object"}, builtin=True)(_never_run)

    def keep(self, step: Step) -> Callable[[], None]:
        """Keep `step` for every start; returns a function that drops it again."""
        self.steps.append(step)

        def drop() -> None:
            if step in self.steps:
                self.steps.remove(step)

        return drop


def _never_run(ctx: ToolContext, args: dict[str, Any]) -> str:
    raise AssertionError("Pending.tools only holds names")


pending = Pending()
_current: Runtime | None = None
STOP_GRACE = 10.0
"""Seconds a SIGTERM waits for the turns in flight before the server shuts down."""


def get() -> Runtime:
    if _current is None:
        raise NotStarted("nonebot-plugin-memsum is not started yet (NoneBot on_startup has not run)")
    return _current


async def start(config: Config, location: Location, nicknames: list[str], superusers: set[str]) -> Runtime:
    """Build the plugin's runtime once (idempotent) and make it the current one."""
    global _current
    if _current is None:
        rt = await build(config, location, nicknames, superusers)
        try:
            check_personas(rt)
        except ConfigError:
            await close(rt)
            raise
        for step in pending.steps:
            step(rt)
        _current = rt
        chat, summary = _current.registry.resolve("chat"), _current.registry.resolve("summary")
        logger.info(
            f"memsum: database {_current.store}; chat model {chat.id if chat else '-'}, "
            f"summary model {summary.id if summary else '-'}; tokenizer {encoding_name()}"
        )
        await check_stored_personas(_current)
        await resume(_current)
        _defer_sigterm(_current)
    return _current


def persona_overflow(rt: Runtime, persona: str) -> tuple[int, int, str] | None:
    """(its tokens, the chat model's trim budget, the model's id) when `persona` takes more
    than half of what a request of the chat model may carry: it goes with every request, so
    the conversation would get less than the persona (or nothing, over the window). None
    when it fits or no chat model is configured."""
    model = rt.registry.resolve("chat")
    if model is None or not persona:
        return None
    over = rt.agent.persona_overflow(persona, model)
    return None if over is None else (*over, model.id)


def persona_refusal(rt: Runtime, persona: str) -> str | None:
    """Why /人设 and the web page refuse `persona` (`persona_overflow`), in Chinese; None
    when it fits."""
    if over := persona_overflow(rt, persona):
        tokens, budget, _ = over
        return (
            f"这段人设约 {tokens} token，超过了模型每次请求可用的一半（{budget} token），"
            "每次回答都要带上它，聊天记录就放不下了。请写短一些"
        )
    return None


def check_personas(rt: Runtime) -> None:
    """Refuse a persona of `.env` (MEMSUM_PERSONA, a tier's) the chat model cannot carry
    (`persona_overflow`); /人设 refuses one the same way."""
    model = rt.registry.resolve("chat")
    if model is not None and persona_overflow(rt, DEFAULT_PERSONA):
        # No persona fits: the reply reserve (or the window) is wrong, not the persona.
        cfg = rt.config
        reserve = rt.agent.reply_reserve(model.max_output_tokens)
        key = "MEMSUM_REPLY_MAX_TOKENS"
        if reserve < cfg.memsum_reply_max_tokens:  # the model's own cap is the smaller
            key = f"MEMSUM_MODELS[{model.id}].max_output_tokens"
        raise ConfigError(
            f"invalid {key}: the reply reserve of {reserve} tokens leaves"
            f" {rt.agent.trim_budget_of(model)} of the chat model {model.id}'s context_window"
            f" {model.context_window} × MEMSUM_TRIM_RATIO {cfg.memsum_trim_ratio} for the persona and"
            " the conversation; make it smaller or use a model with a larger context_window"
        )
    personas = [("MEMSUM_PERSONA", rt.config.memsum_persona)]
    personas += [
        (f"MEMSUM_TIERS[{name}].persona", tier.persona or "") for name, tier in rt.config.memsum_tiers.items()
    ]
    for key, persona in personas:
        if over := persona_overflow(rt, persona):
            tokens, budget, model_id = over
            raise ConfigError(
                f"invalid {key}: the persona takes {tokens} tokens, more than half of the {budget} a"
                f" request of the chat model {model_id} may carry (context_window × MEMSUM_TRIM_RATIO"
                " − the reply reserve); shorten it or use a model with a larger context_window"
            )


async def check_stored_personas(rt: Runtime) -> None:
    """Say once in the log which personas set with /人设 (per place, or per private chat) the
    chat model cannot carry whole: set under a model with a larger window, they are only
    checked when set. Their turns send them cut to fit (`Agent.fit_persona`)."""
    model = rt.registry.resolve("chat")
    if model is None:
        return
    try:
        stored = await rt.store.all_settings()
    except StoreError as err:
        logger.error(f"memsum: could not read the stored personas to check them ({err})")
        return
    for (scope, key), values in stored.items():
        persona = values.get("persona")
        if isinstance(persona, str) and persona:
            rt.agent.fit_persona(persona, model, f"{scope} {key}")


async def resume(rt: Runtime) -> None:
    """Start-up after a stop or a crash: queue the compressions it interrupted; report the
    replies it may have cut (marked as being sent, never as sent: not sent again)."""
    resumed = await rt.compression.resume()
    cut = await rt.store.replies_being_sent()
    if resumed or cut:
        logger.info(
            f"memsum: {resumed} interrupted compressions queued again; {len(cut)} replies were being"
            " sent when the last run stopped (not sent again)"
        )
    for session_id, upto in cut:  # settled: the next start reports only what its last run cut
        rt.store.mark_sent(session_id, upto)


def _defer_sigterm(rt: Runtime) -> None:
    """On SIGTERM let the turns in flight finish (up to STOP_GRACE s) while the connection
    is still up, then hand the signal to the server's own handler (uvicorn's shutdown).
    Their questions need no second turn; anything asked meanwhile is stored and answered
    at the next start. A second SIGTERM, or Ctrl-C, stops at once."""
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):
        return
    loop = asyncio.get_running_loop()
    draining: set[asyncio.Task[None]] = set()

    async def drain(signum: int) -> None:
        logger.info("memsum: SIGTERM: letting the turns in flight finish before stopping")
        left = await rt.agent.drain(STOP_GRACE)
        if left:
            logger.warning(f"memsum: {left} turns still running after {STOP_GRACE:.0f} s; stopping anyway")
        previous(signum, None)

    def handler(signum: int, frame: FrameType | None) -> Any:
        if draining or rt.agent.draining:
            return previous(signum, frame)
        rt.agent.draining = True  # from here no new turn starts
        # call_soon_threadsafe wakes the loop, which may sleep in select().
        loop.call_soon_threadsafe(lambda: draining.add(loop.create_task(drain(signum))))

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave the signal to whoever runs us
        return


async def build(config: Config, location: Location, nicknames: list[str], superusers: set[str]) -> Runtime:
    """Open the store (`location`: `Config.store_location`) and wire every part; tests build
    private ones with this."""
    await aload_encoding(config.memsum_tokenizer)
    store = await open_store(location)
    registry = Registry(
        config.memsum_models,
        preferred=config.memsum_preferred_model,
        preferences={"chat": config.memsum_chat_model, "summary": config.memsum_summary_model},
    )
    client = LLMClient(timeout=config.memsum_llm_timeout, ledger=store.record_usage)
    bus = EventBus()
    settings = Settings(store, config)
    tools = ToolRegistry()
    todos = StoreTodoProvider(store)
    register_todo_tool(tools, todos)
    zone = zone_of(config)
    register_recall_tool(tools, store, estimate_text_tokens, zone)
    agent = Agent(
        store=store,
        client=client,
        registry=registry,
        bus=bus,
        config=config,
        settings=settings,
        tools=tools,
        zone=zone,
    )
    compression = CompressionService(
        store=store,
        client=client,
        registry=registry,
        bus=bus,
        config=config,
        settings=settings,
        agent=agent,
        todos=todos,
        is_owner=owner_check(superusers),  # R-TPL-3: the owner check is NoneBot's SUPERUSERS
    )
    compression.attach()
    controls = Controls(store, settings, config)
    rt = Runtime(
        config, store, registry, client, bus, settings, tools, todos, agent, compression, controls, nicknames
    )
    rt.indexing = asyncio.create_task(keep_search_index(store), name="memsum-search-index")
    return rt


async def keep_search_index(store: Store, batch: int = 2000, idle: float = 1.0, start: float = 1.0) -> None:
    """Index new messages in batches, and what a file from before the search index holds
    (newest first, progress in the log), in the background: start-up does not wait, and a
    search indexes what is still waiting itself."""
    at = await store.search_state()
    old, upto = at.old_upto, at.indexed_upto
    if old > 0:
        logger.info(f"memsum: indexing {old} older messages for search in the background")
    step = max(batch, old // 10)
    mark = step
    await asyncio.sleep(start)  # start-up's own work (and its first answers) first
    while True:
        try:
            at = await store.index_search(batch)
        except asyncio.CancelledError:
            raise
        except StoreError as err:  # a full disk: one line a minute, not a stack trace
            logger.error(f"memsum: indexing messages for search failed ({err}); retrying in a minute")
            await asyncio.sleep(60)
            continue
        except Exception:
            logger.exception("memsum: indexing messages for search failed; retrying in a minute")
            await asyncio.sleep(60)
            continue
        if at is None:
            await asyncio.sleep(idle)
            continue
        caught_up = at.indexed_upto - upto < batch  # fewer new ids than a batch: nothing left
        upto = at.indexed_upto
        if at.old_upto >= old and caught_up:
            # Issue 9: new messages wait for the next batch (a search indexes what waits
            # first), so a busy chat costs one indexing transaction a second, not one a message.
            await asyncio.sleep(idle)
            continue
        if at.old_upto < old:  # a batch of the older messages
            old = at.old_upto
            done = at.total_old - old
            if done >= mark or old == 0:
                logger.info(f"memsum: search index of older messages {100 * done // at.total_old}% built")
                mark = done + step


def owner_check(superusers: set[str]) -> Callable[[str], bool]:
    """Whether a peer is an owner, as NoneBot's SUPERUSER decides it: `onebot:12345` (the
    adapter's name first, the current form) or a bare `12345` (the older one)."""
    return lambda peer: peer in superusers or f"onebot:{peer}" in superusers


async def stop() -> None:
    """Close the current runtime (idempotent)."""
    global _current
    rt, _current = _current, None
    if rt is not None:
        await close(rt)


async def close(rt: Runtime) -> None:
    if rt.indexing is not None:
        rt.indexing.cancel()
        await asyncio.gather(rt.indexing, return_exceptions=True)
    await rt.agent.shutdown()
    await rt.compression.shutdown()
    await rt.client.aclose()
    await rt.store.close()
