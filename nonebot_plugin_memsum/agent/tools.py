"""Tools the chat model may call, and the todo list the work template reads (R-RUN-4).

Other plugins add tools with the `tools.tool(...)` decorator. A tool's failure becomes
its result text; it never breaks the turn.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nonebot.log import logger

from nonebot_plugin_memsum.errors import BadToolName, BadToolSchema, ToolNameTaken
from nonebot_plugin_memsum.store import Store

TODO_NAMESPACE = "todo"
TODO_TOOL = "todo_write"
TODO_STATUSES = ("pending", "in_progress", "done")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""The names OpenAI's API takes (`function.name`); compatible servers check the same."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows about the call."""

    session_id: str


ToolFn = Callable[[ToolContext, dict[str, Any]], Awaitable[str] | str]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]
    run: ToolFn

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


def checked_parameters(name: str, parameters: object) -> dict[str, Any]:
    """A copy of a tool's parameters as they will be sent, or BadToolSchema: OpenAI answers a
    request whose tool parameters are not a schema of type object with a 400 ("schema must be a
    JSON Schema of 'type: \"object\"'"), and what JSON cannot carry fails the request before it
    goes out; either way every turn would fail. A copy, so a later change of the caller's dict
    does not reach the requests."""
    if not isinstance(parameters, Mapping):
        raise BadToolSchema(name, f"are {type(parameters).__name__}, not a mapping")
    if parameters.get("type") != "object":
        raise BadToolSchema(name, f"have type {parameters.get('type')!r}, not 'object'")
    try:
        return json.loads(json.dumps(parameters, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise BadToolSchema(name, f"are not JSON ({err})") from None


class ToolRegistry:
    """The tools offered to the chat model."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._builtin: set[str] = set()

    def tool(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        *,
        replace: bool = False,
        builtin: bool = False,
    ) -> Callable[[ToolFn], ToolFn]:
        """Decorator: `@registry.tool("weather", "…", {"type": "object", …})`. A name already
        registered raises ToolNameTaken unless `replace` (`builtin`: the plugin's own tools);
        one the model APIs refuse (TOOL_NAME) raises BadToolName at once, parameters they
        refuse (`checked_parameters`) BadToolSchema."""
        if not TOOL_NAME.fullmatch(name):
            raise BadToolName(name)
        parameters = checked_parameters(name, parameters)

        def register(fn: ToolFn) -> ToolFn:
            if name in self._tools and not replace:
                raise ToolNameTaken(name, name in self._builtin)
            self._tools[name] = Tool(name, description, parameters, fn)
            if builtin:
                self._builtin.add(name)
            else:  # a built-in name replaced on purpose is another plugin's tool from now on
                self._builtin.discard(name)
            return fn

        return register

    def is_builtin_or_free(self, name: str) -> bool:
        """Whether `name` is one of the plugin's own tools, or no tool's: not another plugin's."""
        return name not in self._tools or name in self._builtin

    def drop(self, name: str) -> None:
        """Stop offering a tool (nothing when there is none by that name)."""
        self._tools.pop(name, None)
        self._builtin.discard(name)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    async def call(self, ctx: ToolContext, name: str, arguments: str) -> str:
        """Run a tool; every failure is reported to the model as the result."""
        tool = self._tools.get(name)
        if tool is None:
            return f"错误：没有名为 {name} 的工具"
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("参数须是 JSON 对象")
            result = tool.run(ctx, args)
            if inspect.isawaitable(result):
                result = await result
            return str(result)
        except Exception as err:
            logger.warning(f"memsum: tool {name} failed: {type(err).__name__}: {err}")
            return f"错误：工具 {name} 执行失败：{err}"


@dataclass(frozen=True, slots=True)
class TodoItem:
    title: str
    status: str


class TodoProvider(Protocol):
    """Where a session's todo items live; the compression reads it for the work template."""

    async def items(self, session_id: str) -> list[TodoItem]: ...

    async def replace(self, session_id: str, items: list[TodoItem]) -> None: ...


class StoreTodoProvider:
    """Todo items kept in the store's metadata (namespace `todo`, key = session id)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def items(self, session_id: str) -> list[TodoItem]:
        raw = await self._store.get_meta(TODO_NAMESPACE, session_id) or []
        return [TodoItem(str(i["title"]), str(i["status"])) for i in raw]

    async def replace(self, session_id: str, items: list[TodoItem]) -> None:
        await self._store.put_meta(
            TODO_NAMESPACE, session_id, [{"title": i.title, "status": i.status} for i in items]
        )


def register_todo_tool(registry: ToolRegistry, provider: TodoProvider, *, replace: bool = False) -> None:
    """The built-in `todo_write` tool: the model rewrites the whole list each time."""

    @registry.tool(
        TODO_TOOL,
        "整体替换本会话的待办列表，用来跟踪多步骤任务的进度。",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "title": {"type": "string"},
                            "status": {"type": "string", "enum": list(TODO_STATUSES)},
                        },
                        "required": ["title", "status"],
                    },
                }
            },
            "required": ["items"],
        },
        replace=replace,
        builtin=True,
    )
    async def todo_write(ctx: ToolContext, args: dict[str, Any]) -> str:
        items = []
        for raw in args.get("items", []):
            status = str(raw.get("status", "pending"))
            if status not in TODO_STATUSES:
                raise ValueError(f"未知状态 {status}")
            items.append(TodoItem(str(raw["title"])[:200], status))
        await provider.replace(ctx.session_id, items)
        return (
            "待办已更新：\n" + "\n".join(f"- [{i.status}] {i.title}" for i in items)
            if items
            else "待办已清空"
        )


def offer_todo_tool(registry: ToolRegistry, provider: TodoProvider | None) -> None:
    """The built-in `todo_write` writing to `provider`, or not offered when None; a
    `todo_write` of another plugin stays as it is."""
    if not registry.is_builtin_or_free(TODO_TOOL):
        return
    if provider is None:
        registry.drop(TODO_TOOL)
    else:
        register_todo_tool(registry, provider, replace=True)
