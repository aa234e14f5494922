"""Full-text search over every stored message of a session, active and archived (issue 11).

Chinese has no spaces, so the text is cut into terms here, in Python, and handed to an
FTS5 table that only splits on the spaces we put in (`unicode61`):

- a run of CJK characters becomes its overlapping bigrams plus its last character
  (`提取码是` → 提取 取码 码是 是), so every two-character word is one term and a word of
  n characters is a phrase of n − 1 consecutive bigrams; a one-character query is a
  prefix query (`码*` finds 码 wherever it stands: as the head of a bigram or the end
  of a run);
- every other run of letters or digits is one term (QQ numbers, codes, English words,
  the pieces of a URL), after NFKC (full-width letters) and lower-casing; a number in a
  query is also looked for with and without thousands separators (`spellings`).

Why this and not FTS5's `trigram` tokenizer or a segmenter: README, "Recall", and
bench/bench_recall.py, which measures the three.

The FTS table is contentless (`content=''`, `columnsize=0`): the messages table already
holds the text, so the index holds terms and positions only. Columns: `body` (the text
without its `[昵称(ID)]` label), `who` (the speaker: label name and QQ number, 助手, 通知)
and `day` (the UTC day it was said). Every term starts with its session's scope (`scope`,
ten hex digits): a word's posting list is the session's own, so the session filter costs
nothing. (The first version had one session term per row instead; intersecting that list,
as long as the session, with the word's took 2 to 35 ms of a query on a million messages.)
Only conversation text is indexed: user, assistant and notice messages. Tool results
are not: a `recall` result quotes old messages, and indexing it would make every later
search find its own echo.

Kept in step with the messages table, whoever wrote to it: new messages are indexed in
batches (`next_batch` / `commit_batch`) by a background task of the runtime, and every
search first indexes what is still waiting, so a search always sees every stored
message. Batches because an FTS5 insert in a transaction of its own costs about five
times the message's own insert (a new index segment per transaction, then merges);
a batch of many rows costs a fraction of that per row, and the terms are cut off the
event loop. Archiving changes nothing (archived rows stay searchable). A clear of the
context calls `forget` in the same transaction: the session's indexed rows leave the
index and a watermark marks everything up to then as cleared, so nothing cleared is
ever returned or indexed later. A database from before the index is indexed the same
way, newest first, in the background (the migration only records how far); so is one
whose index has an older format (migration 7). A reply's text is indexed as it reads
(`indexed_content`): when the message it quotes is withdrawn, `requote` swaps its terms in
the withdrawal's transaction, and a batch re-reads the mark before it writes.

The term rules are part of the file format: a contentless FTS5 row is deleted by
re-deriving its terms, so changing `terms()` or `document()` needs a migration that
rebuilds the index.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from nonebot_plugin_memsum.types import QUOTE_WITHDRAWN_KEY, Message, quote_masked, unquoted

SEARCH_ROLES = ("user", "assistant", "notice")
"""The roles whose messages are indexed (conversation text; not tool results)."""
CANDIDATES = 500
"""Matches ranked per query, the newest: bounds the time a frequent word takes. Each costs
a read of its message row (about 3 µs of CPU on a million messages); 1,000, 500 and 300
gave the same quality on the seeded logs (bench/README.md), 500 leaves room."""
BM25_K1 = 1.2
PRIOR_CHARS = 60
DAY = 86400.0
MAX_DAY_TERMS = 62
RANKED_WORDS = 32
"""Query words the ranking counts (the first ones; every word must still occur): each adds
to one SQL expression, and SQLite refuses one deeper than 1,000 (a pasted paragraph)."""
SCOPE_DIGITS = 10
"""Hex digits of a session's scope (40 bits): two sessions sharing one only share posting
lists, never answers (the query re-checks the session on the message row)."""

_CJK_CHARS = (
    "\u3040-\u30ff"  # kana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # hangul
    "\U00020000-\U0003134f"  # CJK extensions B..
)
_RUNS = re.compile(rf"([{_CJK_CHARS}]+)|([^\W_{_CJK_CHARS}]+)")
_LABEL = re.compile(r"\[([^\[\]\n]*)\((\d+)\)\] ?")
_SPEAKER_WORDS = {"assistant": "助手", "notice": "通知"}


# ---- terms (pure) -------------------------------------------------------------------
def _runs(text: str) -> list[tuple[bool, str]]:
    """(is CJK, run) in order, after NFKC and lower-casing."""
    norm = unicodedata.normalize("NFKC", text).lower()
    return [(m.group(1) is not None, m.group(0)) for m in _RUNS.finditer(norm)]


def _cjk_terms(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)] + [run[-1]]


def terms(text: str) -> list[str]:
    """The index terms of a text, in order."""
    out: list[str] = []
    for cjk, run in _runs(text):
        out.extend(_cjk_terms(run) if cjk else [run])
    return out


def phrase_terms(word: str) -> tuple[list[str], bool] | None:
    """One query word as the terms that must stand in a row, and whether the last one is
    open-ended where the text may go on after it (a lone CJK character, a run of letters:
    `x7k` finds `x7k9`); None when the word holds no term."""
    runs = _runs(word)
    if not runs:
        return None
    out: list[str] = []
    for cjk, run in runs[:-1]:
        out.extend(_cjk_terms(run) if cjk else [run])
    cjk, run = runs[-1]
    prefix = False
    if cjk:
        # The text may go on after the word, so the run's own last-character term would
        # not follow: n characters are the n − 1 bigrams, one character a prefix.
        last = _cjk_terms(run)
        out.extend(last[:-1] if len(run) > 1 else last)
        prefix = len(run) == 1
    else:
        out.append(run)
        prefix = not run.isdigit()  # a QQ number must not find a longer one
    return out, prefix


def spellings(word_terms: list[str]) -> list[list[str]]:
    """A query word's terms, then the same numbers written with and without thousands
    separators: the text's `2,399` is the terms 2 399 and its `2399` one term, and a member
    may type either."""
    joined: list[str] = []
    in_groups = False  # the last term is a number of 1–3 digits and groups of three so far
    for t in word_terms:
        if in_groups and len(t) == 3 and t.isdigit():
            joined[-1] += t
        else:
            joined.append(t)
            in_groups = t.isdigit() and len(t) <= 3
    grouped = [g for t in joined for g in (_groups(t) if t.isdigit() else [t])]
    out = [word_terms]
    for form in (joined, grouped):
        if form not in out:
            out.append(form)
    return out


def _groups(digits: str) -> list[str]:
    """A number's digits in groups of three from the right (`12000` → 12 000)."""
    head = len(digits) % 3 or 3
    return [digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)]


def _phrase(word: str, scope: str) -> str | None:
    """One query word as an FTS5 phrase (`phrase_terms`), each term in the session's scope;
    a number as any of its `spellings`."""
    found = phrase_terms(word)
    if found is None:
        return None
    out, prefix = found
    phrases = [
        '"' + " ".join(scope + t for t in form) + '"' + ("*" if prefix else "") for form in spellings(out)
    ]
    return phrases[0] if len(phrases) == 1 else "(" + " OR ".join(phrases) + ")"


_WORD_BREAKS = re.compile(r"[\s，、；;]+|(?<!\d),|,(?!\d)")


def query_split(query: str) -> list[str]:
    """A query's words: split by blanks and by the marks a Chinese list is written with
    (「网盘，提取码」「周末、爬山」), not by a number's thousands separator (`1,000`)."""
    return [w for w in _WORD_BREAKS.split(query) if w]


def match_expression(query: str, scope: str = "") -> str | None:
    """Every word of `query` (`query_split`) must occur (each as a phrase of terms in
    `scope`); None when the query holds nothing searchable (only punctuation, emoji, blanks)."""
    phrases = [p for w in query_split(query) if (p := _phrase(w, scope)) is not None]
    return " AND ".join(phrases) if phrases else None


def scope(session_id: str) -> str:
    """What every index term of the session starts with (a hash: session ids contain
    separators, and unicode61 joins letters and digits into one token with the term)."""
    return hashlib.blake2b(session_id.encode(), digest_size=SCOPE_DIGITS // 2).hexdigest()


def day_term(scope: str, ts: float) -> str:
    """One index term for the session's messages of one UTC day: a time filter of a few days
    becomes part of the FTS match, so a frequent word in an old week is found without
    walking every newer match. UTC, so a change of the server's time zone changes nothing."""
    return f"{scope}d{math.floor(ts / DAY)}"


def split_label(content: str) -> tuple[str | None, str | None, str]:
    """`[昵称(ID)] 正文` → (昵称, ID, 正文); (None, None, content) without a label."""
    m = _LABEL.match(content)
    if m is None:
        return None, None, content
    return m.group(1), m.group(2), content[m.end() :]


def speaker_of(role: str, name: str | None, content: str) -> str:
    """The label of who said it: `昵称(ID)` for users (the bare ID when unlabelled), 助手, 通知."""
    if role != "user":
        return _SPEAKER_WORDS.get(role, role)
    nick, qq, _ = split_label(content)
    return f"{nick}({qq})" if qq else (name or "")


def indexable(role: str, event_marker: int | bool, content: str) -> bool:
    """Conversation text: not tool results, not event markers, not a call's empty text."""
    return role in SEARCH_ROLES and not event_marker and bool(content.strip())


def document_terms(role: str, name: str | None, content: str) -> tuple[list[str], list[str]]:
    """The terms of what was said (the text without its label) and of who said it (label
    name and QQ number, 助手, 通知); both engines index these."""
    if role == "user":
        nick, qq, body = split_label(content)
        return terms(body), terms(f"{nick or ''} {qq or name or ''}")
    return terms(content), terms(_SPEAKER_WORDS.get(role, role))


def indexed_content(content: str, metadata: str | None) -> str:
    """The text the index holds of a stored message (`metadata` as stored, JSON): a reply's
    quote of a message withdrawn since (QUOTE_WITHDRAWN_KEY) as withdrawn, as `types.unquoted`
    shows it, so a search never finds the reply by the withdrawn words."""
    if metadata and QUOTE_WITHDRAWN_KEY in metadata and json.loads(metadata).get(QUOTE_WITHDRAWN_KEY) is True:
        return quote_masked(content)
    return content


def document(session_id: str, role: str, name: str | None, content: str, ts: float) -> tuple[str, str, str]:
    """(body, who, day) as the FTS5 index stores them, every term in the session's scope."""
    body, who = document_terms(role, name, content)
    at = scope(session_id)
    return " ".join(at + t for t in body), " ".join(at + t for t in who), day_term(at, ts)


def documents(rows: Iterable[Sequence[Any]]) -> list[tuple[int, str, str, str]]:
    """(id, body, who, day) of the indexable rows among (id, session_id, role, name,
    content, event_marker, ts, metadata); pure, so the backfill runs it off the event loop."""
    return [
        (r[0], *document(r[1], r[2], r[3], indexed_content(r[4], r[7]), r[6]))
        for r in rows
        if indexable(r[2], r[5], r[4])
    ]


# ---- the query ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SearchHit:
    """One matching message, its relevance (higher is better, see `search_statement`) and its
    neighbours."""

    message: Message
    score: float
    before: tuple[Message, ...] = ()
    after: tuple[Message, ...] = ()

    @property
    def withdrawn(self) -> frozenset[int]:
        """The ids among them withdrawn on the platform (only a query with `withdrawn=True`
        returns any)."""
        return frozenset(m.id or 0 for m in (*self.before, self.message, *self.after) if m.withdrawn)


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """What to look for in one session. `since`/`until` are unix times (until exclusive);
    `withdrawn`: also messages withdrawn on the platform (group_recall, friend_recall), as hits
    and neighbours. Off for what is said back into a chat (the model's tool, /回忆): a message
    its sender took back is not repeated to the group; the owner's page turns it on."""

    session_id: str
    text: str = ""
    speaker: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 10
    withdrawn: bool = False
    speaker_ids: tuple[str, ...] = ()
    """QQ numbers that also count as `speaker`: the people its name labelled in this session
    (`Store.search` finds them), so a member is found under the card they have now and the
    one they had then."""

    def expression(self) -> str | None:
        """The FTS5 match, or None when neither the text nor the speaker holds a term."""
        at = scope(self.session_id)
        parts: list[str] = []
        if (text := match_expression(self.text, at)) is not None:
            parts.append(f"body : ({text})")
        if self.speaker is not None:
            who = match_expression(self.speaker, at)
            people = [f'"{at}{qq}"' for qq in self.speaker_ids if qq.isdigit()]
            if alternatives := ([f"({who})"] if who is not None else []) + people:
                parts.append(f"who : ({' OR '.join(alternatives)})")
        if not parts:
            return None
        days = self._days()
        if days is not None:
            parts.append("day : (" + " OR ".join(day_term(at, d * DAY) for d in days) + ")")
        return " AND ".join(parts)

    def _days(self) -> range | None:
        """The UTC days a short time range touches (None: no range, or a long one, which the
        join's time check alone narrows)."""
        if self.since is None or self.until is None or self.until <= self.since:
            return None
        first, last = math.floor(self.since / DAY), math.floor(math.nextafter(self.until, -math.inf) / DAY)
        return range(first, last + 1) if last - first < MAX_DAY_TERMS else None


_BODY = (
    "lower(CASE WHEN m.role = 'user' AND m.content GLOB '[[]*([0-9]*)]*'"
    " THEN ltrim(substr(m.content, instr(m.content, ']') + 1), ' ') ELSE m.content END)"
)
"""A message's text without its `[昵称(ID)]` label (the first `]` closes it: a label's name
holds none), lower-cased as SQLite does it (ASCII letters; the query words are NFKC and
lower-cased, so a full-width or non-ASCII capital in the text counts as one occurrence)."""
_CLEARED = "COALESCE((SELECT upto FROM search_cleared WHERE session_id = :session), 0)"


def query_words(text: str) -> list[str]:
    """The query's words as the ranking counts them (normalised as the index's terms are),
    at most RANKED_WORDS of them."""
    return [unicodedata.normalize("NFKC", w).lower() for w in query_split(text) if _runs(w)][:RANKED_WORDS]


def search_statement(query: SearchQuery, columns: str, context: int = 0) -> tuple[str, dict[str, Any]] | None:
    """The one statement (one trip to the database thread) that answers `query`: rows of
    (hit id, side, score, *columns of the message), side 0 for a hit itself, −1 and 1 for
    up to `context` conversation messages of the session before and after it; None when the
    query holds nothing to search.

    The hits: the newest CANDIDATES matches (FTS5 walks its index newest first and stops
    there, so a frequent word costs what a rare one does), ranked inside SQLite by each
    word's count in the text, saturated as bm25 does (the 3rd time adds less), summed, times
    a length prior, then the newest first. The join re-checks the session, the cleared
    watermark and the time, so a row of another session (or scope) or a cleared one never
    comes back, even from a stale index.

    Not FTS5's bm25(): its idf counts every match of every term of the query, which for a
    frequent word in a session of a million messages costs more than the whole query may;
    every word must occur anyway, so idf would only reweight repeats. Not in Python: reading
    and counting a thousand texts there took twice as long (bench/README.md).

    The prior (pivoted length normalisation, Singhal, Buckley & Mitra, SIGIR 1996: longer
    documents are more often relevant than length normalisation credits): in a group chat
    the message holding the information (the link, the date, the announcement) is longer
    than the reactions that repeat its words ("链接呢？"). It grows with the length up to
    PRIOR_CHARS characters and stays flat after.

    The neighbours: for each hit, a correlated range of the index (session_id, archived,
    id) per side and archived value, newest-first before it and oldest-first after it."""
    expression = query.expression()
    if expression is None or query.limit <= 0:
        return None
    words = query_words(query.text)
    # bm25's saturation c·(k1 + 1)/(c + k1), written with c once: SQLite copies a column's
    # expression wherever it is used, so each count is taken once per row.
    tf = " + ".join(
        f"{BM25_K1 + 1:g} - {BM25_K1 * (BM25_K1 + 1):g}"
        f" / (max(1, (length(b) - length(replace(b, :w{i}, ''))) / length(:w{i})) + {BM25_K1:g})"
        for i in range(len(words))
    )
    m_columns = ", ".join("m." + c.strip() for c in columns.split(","))
    shown = "" if query.withdrawn else " AND withdrawn = 0"
    parts = [
        f"SELECT ranked.id, 0, ranked.score, {m_columns} FROM ranked JOIN messages m ON m.id = ranked.id"
    ]
    for side, op, order in ((-1, "<", "DESC"), (1, ">", "ASC")) if context > 0 else ():
        for archived in (0, 1):
            parts.append(
                f"SELECT ranked.id, {side}, NULL, {m_columns} FROM ranked JOIN messages m ON m.id IN"
                f" (SELECT id FROM messages WHERE session_id = :session AND archived = {archived}"
                f" AND id {op} ranked.id AND id > {_CLEARED} AND event_marker = 0{shown}"
                f" AND role IN {SEARCH_ROLES!r} AND trim(content) != '' ORDER BY id {order} LIMIT :context)"
            )
    sql = (
        f"WITH found AS (SELECT m.id, {_BODY} AS b"
        " FROM search_index JOIN messages m ON m.id = search_index.rowid WHERE search_index MATCH :match"
        f" AND m.session_id = :session AND m.id > {_CLEARED}{shown.replace('withdrawn', 'm.withdrawn')}"
        " AND m.ts >= :since AND m.ts < :until ORDER BY search_index.rowid DESC LIMIT :candidates),"
        f" ranked AS (SELECT id, ({tf or 0}) * min(length(b), {PRIOR_CHARS}) / {float(PRIOR_CHARS)} AS score"
        " FROM found ORDER BY score DESC, id DESC LIMIT :limit) " + " UNION ALL ".join(parts)
    )
    params: dict[str, Any] = {
        "match": expression,
        "session": query.session_id,
        "since": -math.inf if query.since is None else query.since,
        "until": math.inf if query.until is None else query.until,
        # Without words every match scores the same: the newest are the best.
        "candidates": CANDIDATES if words else query.limit,
        "limit": query.limit,
        "context": context,
    }
    params.update({f"w{i}": w for i, w in enumerate(words)})
    return sql, params


async def cleared_upto(db: aiosqlite.Connection, session_id: str) -> int:
    async with db.execute("SELECT upto FROM search_cleared WHERE session_id = ?", (session_id,)) as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


# ---- keeping it in step -------------------------------------------------------------
INSERT = "INSERT INTO search_index (rowid, body, who, day) VALUES (?, ?, ?, ?)"
_DOC_COLUMNS = "id, session_id, role, name, content, event_marker, ts, metadata"
DELETE = "INSERT INTO search_index (search_index, rowid, body, who, day) VALUES ('delete', ?, ?, ?, ?)"
"""A contentless FTS5 row is deleted by naming the terms it was indexed with."""
Doc = tuple[int, str, str, str]


@dataclass(frozen=True, slots=True)
class IndexState:
    """Messages with id <= old_upto were stored before the index existed and wait for the
    backfill (it walks down); those in (old_upto, indexed_upto] are indexed (unless cleared
    or not conversation text); those above indexed_upto are new and wait for the next batch."""

    old_upto: int
    indexed_upto: int
    total_old: int


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows read for indexing: new ones (ids above indexed_upto) or old ones (a range below old_upto)."""

    new: bool
    low: int
    high: int
    rows: list[tuple[Any, ...]]


async def state(db: aiosqlite.Connection) -> IndexState:
    async with db.execute("SELECT old_upto, indexed_upto, total_old FROM search_state WHERE id = 1") as cur:
        row = await cur.fetchone()
    return IndexState(*(int(v) for v in row)) if row else IndexState(0, 0, 0)


async def next_batch(db: aiosqlite.Connection, size: int, *, new_only: bool = False) -> Batch | None:
    """The next rows to index: new messages first (oldest of them first), then the backfill
    (newest of the old first, so recent history is searchable soonest)."""
    rows = await db.execute_fetchall(
        f"SELECT {_DOC_COLUMNS} FROM messages"
        " WHERE id > (SELECT indexed_upto FROM search_state WHERE id = 1) ORDER BY id LIMIT ?",
        (size,),
    )
    if not rows and new_only:
        return None  # one trip when nothing waits: every search asks first
    at = await state(db)
    if rows:
        return Batch(True, at.indexed_upto + 1, int(list(rows)[-1][0]), [tuple(r) for r in rows])
    if at.old_upto <= 0:
        return None
    low = max(1, at.old_upto - size + 1)
    rows = await db.execute_fetchall(
        f"SELECT {_DOC_COLUMNS} FROM messages WHERE id BETWEEN ? AND ?", (low, at.old_upto)
    )
    return Batch(False, low, at.old_upto, [tuple(r) for r in rows])


async def commit_batch(db: aiosqlite.Connection, batch: Batch, docs: Sequence[Doc]) -> IndexState:
    """Index a prepared batch (inside a transaction), leaving out rows cleared meanwhile; a
    batch another call has committed already is dropped."""
    at = await state(db)
    if (batch.new and at.indexed_upto != batch.low - 1) or (not batch.new and at.old_upto != batch.high):
        return at
    marks = {sid: await cleared_upto(db, sid) for sid in {r[1] for r in batch.rows}}
    session_of = {r[0]: r[1] for r in batch.rows}
    # A reply whose quote was marked withdrawn since the batch was read (`requote` found it
    # not indexed yet) goes in as it reads now.
    requoted = await db.execute_fetchall(
        f"SELECT {_DOC_COLUMNS} FROM messages WHERE id BETWEEN ? AND ? AND metadata LIKE ?",
        (batch.low, batch.high, f'%"{QUOTE_WITHDRAWN_KEY}":true%'),
    )
    now = {d[0]: d for d in documents(requoted)}
    docs = [now.get(d[0], d) for d in docs]
    await db.executemany(INSERT, [d for d in docs if d[0] > marks[session_of[d[0]]]])
    if batch.new:
        await db.execute("UPDATE search_state SET indexed_upto = ? WHERE id = 1", (batch.high,))
        return IndexState(at.old_upto, batch.high, at.total_old)
    await db.execute("UPDATE search_state SET old_upto = ? WHERE id = 1", (batch.low - 1,))
    return IndexState(batch.low - 1, at.indexed_upto, at.total_old)


async def forget(db: aiosqlite.Connection, session_id: str) -> int:
    """Everything the session stored so far is cleared (inside a transaction): its indexed
    rows leave the index, and the watermark keeps them and any row not indexed yet out for
    good. Returns how many rows left the index."""
    wm = await cleared_upto(db, session_id)
    at = await state(db)
    rows = await db.execute_fetchall(
        f"SELECT {_DOC_COLUMNS} FROM messages WHERE session_id = ? AND id > ? AND id <= ?",
        (session_id, max(wm, at.old_upto), at.indexed_upto),
    )
    docs = await asyncio.to_thread(documents, rows)
    await db.executemany(DELETE, docs)
    await db.execute(
        "INSERT INTO search_cleared (session_id, upto)"
        " SELECT ?, MAX(COALESCE((SELECT MAX(id) FROM messages WHERE session_id = ?), 0), ?)"
        " ON CONFLICT (session_id) DO UPDATE SET upto = excluded.upto",
        (session_id, session_id, wm),
    )
    return len(docs)


async def requote(db: aiosqlite.Connection, session_id: str, reply: Message) -> None:
    """A reply whose quote was just marked withdrawn (inside that transaction; `reply` as it
    reads now): if the index holds it, its terms as they were out, as it reads now in. One
    not indexed yet, or cleared, is left to its batch, which reads the mark."""
    assert reply.id is not None
    at = await state(db)
    if not at.old_upto < reply.id <= at.indexed_upto or reply.id <= await cleared_upto(db, session_id):
        return
    if not indexable(reply.role, reply.event_marker, reply.content):
        return
    was = document(session_id, reply.role, reply.name, reply.content, reply.ts)
    await db.execute(DELETE, (reply.id, *was))
    await db.execute(
        INSERT, (reply.id, *document(session_id, reply.role, reply.name, unquoted(reply), reply.ts))
    )
