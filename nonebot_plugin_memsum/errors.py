"""Every error the plugin raises on purpose, in one tree with one base.

    MemsumError
    ├── ConfigError               a `.env` value is out of range or of the wrong shape
    ├── NotStarted                the plugin is used before NoneBot started it (also a RuntimeError)
    ├── SessionNotFound           `api` was given a session id that was never created (also a LookupError)
    ├── TurnInProgress            `api.run_turn` called inside that session's own turn (also a RuntimeError)
    ├── ToolNameTaken             `api.tool` was given a name already offered to the model (also a ValueError)
    ├── BadToolName               `api.tool` was given a name the model APIs refuse (also a ValueError)
    ├── BadToolSchema             `api.tool` was given parameters the model APIs refuse (also a ValueError)
    ├── StoreError                the SQLite file cannot be opened, read or written
    │   ├── ClearedMeanwhile      not stored: the context was cleared since the turn read it
    │   └── SchemaTooNewError     the file was written by a newer version of the plugin
    ├── NoChatModel               no chat-capable model is configured
    ├── NotDelivered              the platform says a message did not go out (a muted bot, a group it left)
    ├── CompressionError          a compression did not happen; `reason` is for the user
    │   └── CompressionCancelled  a clear (R-MEM-3) or the shutdown stopped it: no failure
    └── LLMError                  a model request failed (llm/errors.py)
        ├── LLMConnectError       not reached, or dropped before answering
        ├── LLMTimeout            no complete reply in time
        ├── LLMStatusError        an HTTP error status
        │   ├── LLMAuthError      401 / 403
        │   ├── LLMRateLimited    429
        │   ├── LLMServerError    5xx
        │   └── LLMBadRequest     other 4xx
        │       └── LLMInputRefused  the provider's content review refused the input
        ├── LLMStreamCut          the reply stopped before its end
        ├── LLMEmptyReply         a reply that said nothing, not even why it ended
        ├── LLMLengthLimit        the reply was cut at the output limit (it carries the result)
        ├── LLMContentFilter      the provider's content filter stopped the reply
        ├── LLMErrorReply         a 2xx answer that is an error naming no HTTP status
        └── LLMBadResponse        an answer that is not a completion

Callers branch on the class, never on the text: the messages are for people (Chinese
`reason`s) and operators (logs). The LLM branch lives in `llm/errors.py`, next to the
client that raises it; every other class is defined here and re-exported where it is
raised.
"""

from __future__ import annotations


class MemsumError(Exception):
    """Base of every error the plugin raises on purpose."""


class ConfigError(MemsumError):
    """A setting of `.env` is out of range or of the wrong shape."""


class NotStarted(MemsumError, RuntimeError):
    """The plugin is used before NoneBot started it."""


class SessionNotFound(MemsumError, LookupError):
    """A session id no `api.record`, `internal_session`, `child_session` or chat created
    (a typo, or a session deleted since)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"no session {session_id!r}: create it with api.internal_session or api.record first"
        )
        self.session_id = session_id


class TurnInProgress(MemsumError, RuntimeError):
    """`api.run_turn` called from inside the same session's turn (a tool, a contribution):
    it would wait for its own turn to end, forever."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"api.run_turn({session_id!r}) was called from inside that session's own turn (a tool"
            " or a contribution): the turn in progress answers what is new; run another session's"
            " turn, or this one after the turn"
        )
        self.session_id = session_id


class ToolNameTaken(MemsumError, ValueError):
    """A tool name already registered (a built-in one, or another plugin's); `api.tool(...,
    replace=True)` replaces it on purpose."""

    def __init__(self, name: str, builtin: bool) -> None:
        whose = "built in to nonebot-plugin-memsum" if builtin else "registered by another plugin"
        super().__init__(
            f"a tool named {name!r} is already offered to the model ({whose}); choose another"
            " name, or pass replace=True to replace it"
        )
        self.name = name


class BadToolName(MemsumError, ValueError):
    """A tool name OpenAI-compatible APIs refuse (they answer every request offering it
    with a 400): 1 to 64 of a-z, A-Z, 0-9, `_` and `-`."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"tool name {name!r} would make the model API refuse every request: use 1 to 64 of"
            " a-z, A-Z, 0-9, '_' and '-' (say what the tool does in Chinese in its description)"
        )
        self.name = name


class BadToolSchema(MemsumError, ValueError):
    """Tool parameters OpenAI-compatible APIs refuse, or that cannot be sent at all: not a
    JSON Schema object of `"type": "object"` made of JSON values. Offered, they would fail
    every request of every session."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(
            f"the parameters of tool {name!r} {why}: give a JSON Schema object such as"
            ' {"type": "object", "properties": {...}}'
        )
        self.name = name


class StoreError(MemsumError):
    """The store could not be opened, read or written, or was used the wrong way."""


class ClearedMeanwhile(StoreError):
    """Not stored: the session's context was cleared (or the session deleted) after the
    turn that wrote it read the history (R-MEM-2; `Store.clears`)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id}: its context was cleared since this turn began")
        self.session_id = session_id


class SchemaTooNewError(StoreError):
    """The file was written by a newer version of the plugin than this one."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(f"schema version {found} is newer than this code knows ({known})")
        self.found = found
        self.known = known


class NoChatModel(MemsumError):
    """No chat-capable model is configured."""


class NotDelivered(MemsumError):
    """The platform answered that a message did not go out (the bot muted, removed from the
    group, no connection came back): a reply function raises it, and the turn then does not
    remember its answer as said. Any other failure of a send may have delivered it."""


class CompressionError(MemsumError):
    """A compression that did not happen; `reason` is short Chinese for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CompressionCancelled(CompressionError):
    """A clear of the session (R-MEM-3) or the shutdown stopped the run before its commit:
    nothing was written, and it is no failure (R-BACK-4)."""
