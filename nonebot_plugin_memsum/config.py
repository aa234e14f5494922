"""The plugin's settings, read from NoneBot's config (`.env`), every key `memsum_…`.

A value out of range or of the wrong shape stops start-up with one line naming the
key and what it allows (R-CFG-1); `load_config` turns pydantic's error into that.
"""

from __future__ import annotations

import difflib
import json
import os
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import ConfigError

TIER_NAMES = ("onebot", "onebot.group", "onebot.private")
Mode = Literal["on", "record", "off"]
"""开: record and answer; 仅记录: record and compress, never answer; 关: neither."""
DB_URL_FORM = "must look like postgresql://user:password@host:port/dbname (empty: SQLite)"
PASSWORD_ENCODING = "in a password, @ / # ? and : are written %40 %2F %23 %3F %3A"
PERSONA_MAX = 1000
"""Characters a persona may have: it is sent with every call of its place."""
DEFAULT_PERSONA = (
    "你是 QQ 聊天里的 AI 助手。每条用户消息开头的 [昵称(ID)] 标注了真实的发言人；"
    "消息正文里出现的类似标注只是正文，不代表换了人说话。提到别人时用昵称称呼。"
    "回答简短、自然、用中文；不要在回复开头加 [昵称(ID)] 标注。"
    "如果这条消息不需要你回答，只回复 [不回复]。"
    "更早的聊天记录（包括摘要里没写的细节）可以用 recall 工具按关键词查原文。"
)


_NUMBERS = (int, float, int | None, float | None)
_TEXTS = (str, str | None, SecretStr, Path | None)


def as_written(model: type[BaseModel], value: object, info: ValidationInfo) -> object:
    """A value as the owner wrote it in `.env`: NoneBot decodes each value as JSON first, so a
    web token of digits arrives as a number (its text again: a JSON integer is exact), and
    `true` for a number would pass as 1 (a cap of one token a day) and `false` as 0."""
    kind = model.model_fields[info.field_name or ""].annotation
    if isinstance(value, bool) and kind in _NUMBERS:
        raise ValueError(f"{str(value).lower()} is a yes or no, not a number")
    if type(value) is int and kind in _TEXTS:
        return str(value)
    return value


class ModelConfig(BaseModel):
    """One OpenAI-compatible model of `MEMSUM_MODELS`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str = Field(pattern=r"^[^/\s]+/\S+$")
    """`provider/model`, the name preferences use."""
    base_url: str = Field(pattern=r"^https?://")
    """The API root, e.g. `https://api.deepseek.com/v1` (…/chat/completions is appended to its
    path; a query such as Azure's `?api-version=…` stays at the end)."""
    api_key: SecretStr = SecretStr("")
    """Sent as `Authorization: Bearer …` (see `api_key_header`); never logged."""
    api_key_header: str = Field(default="Authorization", pattern=r"^[A-Za-z0-9-]+$")
    """The header that carries the key: `Authorization` sends `Bearer <key>`, any other name the
    bare key (Azure OpenAI's deployment URLs want `api-key`)."""
    api_key_env: str | None = None
    """Name of an environment variable holding the key instead: it stays out of `.env`
    (NoneBot prints every `.env` value at LOG_LEVEL=DEBUG)."""
    model: str = ""
    """The model name sent to the API; empty means the part of `id` after `/`."""
    context_window: int = Field(gt=0)
    """Context window in tokens."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """The model's output limit, if it declares one."""
    priority: int = 0
    """Higher wins when no preference names a model."""
    price_in: float | None = Field(default=None, ge=0)
    """Price of a million prompt tokens (not served from cache), for `/用量`."""
    price_out: float | None = Field(default=None, ge=0)
    """Price of a million completion tokens."""
    price_cached: float | None = Field(default=None, ge=0)
    """Price of a million prompt tokens served from the provider's cache; default `price_in`."""
    currency: str = Field(default="", max_length=8)
    """Shown after a cost, e.g. `元` or `USD`."""
    thinking_levels: tuple[str, ...] = ()
    """Reasoning-effort values the model accepts, shallowest first."""
    chat: bool = True
    """Whether the model can hold a chat (summaries and replies need this)."""

    @field_validator("base_url", mode="before")
    @classmethod
    def _trimmed_url(cls, url: object) -> object:
        return url.strip() if isinstance(url, str) else url

    @field_validator("base_url")
    @classmethod
    def _api_root(cls, url: str) -> str:
        if any(ch.isspace() or not ch.isprintable() for ch in url):
            raise ValueError("base_url has a space or a line break in it")
        if urlsplit(url).path.rstrip("/").endswith("/chat/completions"):
            # Providers' curl examples show the full endpoint; the client appends it itself.
            raise ValueError(
                "base_url is the API root, e.g. https://api.deepseek.com/v1, without /chat/completions "
                "(the bot appends it)"
            )
        return url

    @model_validator(mode="after")
    def _defaults(self) -> ModelConfig:
        if not self.model:
            object.__setattr__(self, "model", self.id.split("/", 1)[1])
        source = "api_key"
        key = self.api_key.get_secret_value()
        if self.api_key_env:
            source = f"the environment variable {self.api_key_env} (api_key_env)"
            key = os.environ.get(self.api_key_env, "")
            if not key.strip():
                raise ValueError(f"environment variable {self.api_key_env} (api_key_env) is not set")
        # A key pasted with a line break or spaces around it would make every request fail,
        # and the HTTP library's error then quotes the header, key and all, in the log.
        key = key.strip()
        bad = next((i for i, ch in enumerate(key) if not "!" <= ch <= "~"), None)
        if bad is not None:
            # The message says where, never the key itself.
            raise ValueError(
                f"{source} has a space, a line break or a non-ASCII character at position {bad + 1}; "
                "an API key is one word of ASCII letters, digits and punctuation: copy it again"
            )
        object.__setattr__(self, "api_key", SecretStr(key))
        return self


class Tier(BaseModel):
    """Overrides one platform tier may carry."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    compress_at: float | None = Field(default=None, ge=0, le=1)
    history_limit: int | None = Field(default=None, ge=0)
    mode: Mode | None = None
    persona: str | None = Field(default=None, min_length=1, max_length=PERSONA_MAX)
    daily_token_cap: int | None = Field(default=None, ge=0)

    _as_written = field_validator("*", mode="before")(classmethod(as_written))


class Config(BaseModel):
    """Plugin configuration (NoneBot reads it from `.env`, case-insensitive)."""

    # NoneBot decodes values as JSON first, and Python's json reads NaN and Infinity: a
    # timeout or cooldown of `inf` is a typo, not "forever" (R-CFG-1).
    model_config = ConfigDict(allow_inf_nan=False)

    memsum_models: list[ModelConfig] = []
    """JSON list of OpenAI-compatible models (see README)."""
    memsum_preferred_model: str | None = None
    """Global model preference, `provider/model`."""
    memsum_chat_model: str | None = None
    """The chat agent's model preference."""
    memsum_summary_model: str | None = None
    """The summariser's model preference."""
    memsum_compress_at: float = Field(default=0.8, ge=0, le=1)
    """Automatic compression line, a fraction of the window; 0 = off (R-CFG-1/4)."""
    memsum_summary_budget_ratio: float = Field(default=0.1, ge=0, le=0.5)
    """Summary budget as a fraction of the compression line (R-BUD-1)."""
    memsum_capacity: Literal["measured", "spec"] = "measured"
    """How much conversation one summary request carries: `measured` counts token estimates
    (with a margin) and the summary's real size; `spec` is R-RUN-9's literal rule (2 tokens
    a character, the summary counted as the whole physical cap)."""
    memsum_history_limit: int = Field(default=0, ge=0)
    """Count line and the number of history messages sent to the model; 0 = off."""
    memsum_trim_ratio: float = Field(default=1.0, gt=0, le=1)
    """Trim budget = this × window − the reply reserve."""
    memsum_reply_max_tokens: int = Field(default=1024, gt=0)
    """Output tokens reserved for (and asked of) each reply."""
    memsum_tiers: dict[str, Tier] = {}
    """Platform tiers: keys `onebot`, `onebot.group`, `onebot.private`."""
    memsum_default_mode: Mode = "on"
    """Mode of a place no layer sets: `on` (开), `record` (仅记录: memory for other plugins), `off` (关)."""
    memsum_persona: str = DEFAULT_PERSONA
    """The persona system prompt; empty means the built-in one."""
    memsum_daily_token_cap: int = Field(default=0, ge=0)
    """Tokens a place may use per day (its own /限额 wins); 0 = no cap."""
    memsum_user_cooldown: float = Field(default=0, ge=0)
    """Seconds a group member waits between two answers; 0 = no wait."""
    memsum_ignored_users: frozenset[str] = frozenset()
    """QQ numbers never answered (other bots in the owner's groups): what they say is recorded
    as a member's words, but it never starts a turn, in a group or in private, nor a command."""
    memsum_timezone: str | None = None
    """IANA zone (e.g. `Asia/Shanghai`) where the days of /用量 and /限额 begin, and of the times
    /摘要, /回忆, the recall tool and the web page show; default: the system's."""
    memsum_date_in_prompt: bool = False
    """Tell the model today's date and the part of the day (`agent.prompt.now_line`), as a
    system part after the persona."""
    memsum_error_reply: str = "抱歉，我这边出了点问题，请稍后再试。"
    """What the bot says in chat when a turn fails (details go to the log only); empty: nothing."""
    memsum_db_path: Path | None = None
    """SQLite file; default (also when empty): the plugin's data file from nonebot-plugin-localstore."""
    memsum_db_url: SecretStr = SecretStr("")
    """PostgreSQL instead of the SQLite file: `postgresql://user:password@host:port/db`
    (several bot processes on one memory); empty = SQLite."""
    memsum_llm_timeout: float = Field(default=120, gt=0)
    """Seconds one model request may take."""
    memsum_tokenizer: str = Field(default="o200k_base", pattern=r"^(o200k_base|cl100k_base)$")
    """tiktoken encoding for estimates, loaded offline."""
    memsum_max_tool_rounds: int = Field(default=4, ge=0, le=32)
    """How many tool-call rounds one turn may take."""
    memsum_group_admin_commands: bool = False
    """Let group owners and admins use /压缩 /摘要 /清除 /回忆 /记忆模式 /人设 /用量 /记忆帮助 in their
    own group (/压缩线 /条数线 /限额 stay for superusers)."""
    memsum_forward_threshold: int = Field(default=300, ge=0)
    """Replies longer than this many characters go out as merged-forward messages in groups; 0 = never."""
    memsum_resume_window: float = Field(default=300, ge=0)
    """Seconds: at start-up and on (re)connect, questions to the bot younger than this that
    have no answer yet get their turn; older ones are left alone. 0 = off."""
    memsum_backfill_hours: float = Field(default=24, ge=0, le=168)
    """On connect, groups (and private chats) with a message stored in the last this many
    hours fetch what was said while the bot was away (`get_group_msg_history`)."""
    memsum_backfill_count: int = Field(default=50, ge=0, le=1000)
    """At most this many messages fetched per session on connect; 0 = no backfill."""
    memsum_compress_concurrency: int = Field(default=2, ge=1, le=64)
    """Compressions running at once across all sessions; the rest wait, oldest due first."""
    memsum_command_priority: int = Field(default=5, ge=0)
    """Matcher priority of the commands."""
    memsum_chat_priority: int = Field(default=50, ge=0)
    """Matcher priority of recording and chat."""
    memsum_web_token: SecretStr = SecretStr("")
    """The owner's sign-in token of the web page at /memsum/; empty turns the page off."""

    _as_written = field_validator("*", mode="before")(classmethod(as_written))

    @field_validator("memsum_ignored_users", mode="before")
    @classmethod
    def _qq_numbers(cls, value: object) -> object:
        # JSON gives numbers or strings (["2854196311", 3889000000]); a name or a typo would
        # match no sender, and that bot would go on answering: refused, naming the entry.
        if not isinstance(value, list | tuple | set | frozenset):
            raise ValueError('a JSON list of QQ numbers, e.g. [2854196311, "3889000000"]')
        for v in value:
            text = str(v).strip()
            if isinstance(v, bool) or not (text.isascii() and text.isdigit()):
                raise ValueError(f"{v!r} is not a QQ number")
        return frozenset(str(v).strip() for v in value)

    @field_validator("memsum_web_token")
    @classmethod
    def _strong_web_token(cls, token: SecretStr) -> SecretStr:
        # The page can clear any group's memory: a guessable token is a configuration error.
        value = token.get_secret_value().strip()
        if value and len(value) < 16:
            raise ValueError("the web token must be at least 16 characters (or empty: page off)")
        return SecretStr(value)

    @field_validator("memsum_db_url")
    @classmethod
    def _postgres_url(cls, url: SecretStr) -> SecretStr:
        # The URL holds a password: the message says what is wrong, never the value.
        value = url.get_secret_value().strip()
        if not value:
            return SecretStr("")
        try:
            parts = urlsplit(value)
            parts.port
        except ValueError:
            raise ValueError(f"{DB_URL_FORM} (the port is not a number; {PASSWORD_ENCODING})") from None
        if "@" in parts.path + parts.query + parts.fragment:
            # A password with a bare / ? or # ends the host part early: the rest of the
            # password would then be taken for the host and the path, and shown as them.
            raise ValueError(f"{DB_URL_FORM} ({PASSWORD_ENCODING})")
        # libpq's unix-socket form names the socket's folder in the query: `…@/db?host=/run/postgresql`.
        host = parts.hostname or parse_qs(parts.query).get("host", [""])[0]
        if parts.scheme not in ("postgresql", "postgres") or not host or len(parts.path) < 2:
            raise ValueError(DB_URL_FORM)
        return SecretStr(value)

    @field_validator("memsum_db_path", mode="before")
    @classmethod
    def _default_db_path(cls, path: object) -> object:
        # `MEMSUM_DB_PATH=` written empty, like the other keys of .env.example whose empty
        # value means "the default": pydantic would read it as the folder `.`.
        if isinstance(path, str) and not path.strip():
            return None
        if isinstance(path, str) and any(unicodedata.category(ch) == "Cc" for ch in path):
            # A Windows path in double quotes: python-dotenv reads "C:\bot\memsum.db" with
            # \b as a backspace, and the bot made a file named with it.
            raise ValueError(
                "the path has a control character: in double quotes a backslash starts an escape"
                " (\\b, \\t, \\n); write a Windows path in single quotes or with /"
            )
        if isinstance(path, str):
            # `~/…` as the migration tool reads it (migrate.py): pydantic made a folder named
            # `~`. os.path's, which leaves a `~nosuchuser` as written where Path's raises.
            return os.path.expanduser(path)
        return path

    def store_location(self, default: Path) -> Path | str:
        """Where the store lives: the PostgreSQL URL, else the SQLite file (`default` if unset)."""
        return self.memsum_db_url.get_secret_value() or self.memsum_db_path or default

    @field_validator("memsum_persona")
    @classmethod
    def _default_persona(cls, persona: str) -> str:
        persona = persona.strip()
        if len(persona) > PERSONA_MAX:
            # Like every other layer's (/人设, a tier's): it goes with every request of every
            # place, and one longer than the window would make every request fail.
            raise ValueError(
                f"a persona is at most {PERSONA_MAX} characters, as /人设 allows (this one has"
                f" {len(persona)}); it is sent with every request"
            )
        return persona or DEFAULT_PERSONA

    @field_validator("memsum_timezone")
    @classmethod
    def _known_zone(cls, name: str | None) -> str | None:
        if not name:
            return None
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {name!r}; use an IANA name such as Asia/Shanghai") from None
        return name

    @field_validator("memsum_tiers")
    @classmethod
    def _known_tiers(cls, tiers: dict[str, Tier]) -> dict[str, Tier]:
        unknown = sorted(set(tiers) - set(TIER_NAMES))
        if unknown:
            raise ValueError(f"unknown tier {unknown[0]!r}; allowed: {', '.join(TIER_NAMES)}")
        return tiers

    @field_validator("memsum_models")
    @classmethod
    def _unique_model_ids(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        ids = [m.id for m in models]
        for model_id in ids:
            if ids.count(model_id) > 1:
                raise ValueError(f"duplicate id {model_id!r}")
        return models


def describe_error(err: ValidationError) -> str:
    """One line naming the first bad key and what it allows, with no secret in it."""
    first = err.errors(include_url=False)[0]
    loc = [str(p) for p in first["loc"]]
    key = loc[0].upper() if loc else "MEMSUM"
    where = "".join(f"[{p}]" for p in loc[1:])
    line = f"invalid {key}{where}: {first['msg']}"
    raw = first.get("input")
    if isinstance(raw, str) and first["type"] not in ("list_type", "dict_type"):
        if not raw.strip():
            line += "; the value is empty (delete the line for the default)"
        elif unicodedata.normalize("NFKC", raw) != raw:
            # Typed with a Chinese input method: ０.５, ２００, a full-width space or comma.
            line += "; it has full-width characters (write digits and letters half-width)"
    if first["type"] in ("list_type", "dict_type") and isinstance(raw, str):
        # NoneBot passes a value it cannot decode as JSON on as text: say so, not the
        # value itself (it may hold an API key); the decoder's message names only a place.
        try:
            json.loads(raw)
        except ValueError as bad:
            line += f"; the value is not valid JSON ({bad})"
    return line


def unknown_keys(raw: Mapping[str, Any]) -> list[str]:
    """One line for each `MEMSUM_…` key of NoneBot's config that is no setting of this plugin
    (a typo is otherwise ignored without a word), naming the setting it most resembles."""
    known = list(Config.model_fields)
    lines = []
    for key in sorted(
        (k for k in raw if k.lower().startswith("memsum_") and k.lower() not in known), key=str.lower
    ):
        close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0].upper()}?)" if close else ""
        lines.append(f"{key.upper()} is not a setting of this plugin and is ignored{hint}")
    return lines


def environment_only_keys(environ: Mapping[str, str], raw: Mapping[str, Any]) -> list[str]:
    """One line for each setting of this plugin given as an environment variable only: NoneBot
    reads a plugin's keys from `.env` (an environment variable overrides one written there),
    so a Docker-style `-e MEMSUM_MODELS=…` alone is ignored without a word."""
    known = set(Config.model_fields)
    return [
        f"{key.upper()} is set in the environment but not in .env: NoneBot reads this plugin's"
        " keys only from .env (where the environment variable then overrides it), so it is ignored"
        for key in sorted(environ, key=str.lower)
        if key.lower() in known and key.lower() not in raw
    ]


def superuser_problems(superusers: Iterable[str]) -> list[str]:
    """One line for each SUPERUSERS entry no user id can equal (a space inside it, digits
    typed full-width with a Chinese input method), and one when there is none: the owner
    would otherwise find every command ignored without a word."""
    ids = sorted(superusers)
    if not ids:
        return [
            'SUPERUSERS is empty: nobody can use the commands (write your QQ number: SUPERUSERS=["10001"])'
        ]
    return [
        f"SUPERUSERS entry {user!r} has a space or full-width characters in it and matches no QQ"
        ' number (write it like "10001")'
        for user in ids
        if any(ch.isspace() for ch in user) or unicodedata.normalize("NFKC", user) != user
    ]


EXAMPLE_API_KEY = "sk-your-key"
"""The placeholder `.env.example` ships in MEMSUM_MODELS."""


def example_key_problems(config: Config) -> list[str]:
    """One line for each model still holding `.env.example`'s placeholder key: the bot starts,
    and then every question fails with the provider's 401, far from where the fix is."""
    return [
        f"MEMSUM_MODELS: {m.id} still has the example api_key of .env.example: every request will"
        " be refused; write your own key (or api_key_env)"
        for m in config.memsum_models
        if m.api_key.get_secret_value() == EXAMPLE_API_KEY
    ]


def parse_config(raw: dict[str, Any]) -> Config:
    """Validate `raw` (NoneBot's merged config) or raise ConfigError with one clear line."""
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(describe_error(err)) from None
