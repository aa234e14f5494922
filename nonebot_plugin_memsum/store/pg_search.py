"""The recall search index on PostgreSQL: the same terms as on SQLite (store/search.py cuts
them: CJK bigrams, runs of letters or digits), in a `tsvector` with a GIN index.

A tsvector written as a literal (`'提取':1 '取码':2 ...`) keeps each term exactly as
given, with its position, so a word of n CJK characters is the phrase of its n − 1
bigrams (`'提取' <-> '取码'`), one character a prefix (`'码':*`), as in FTS5; PostgreSQL's
own parser is never involved (its word rules depend on the server's locale). The
speaker's terms carry weight C and the session's and its days' terms weight B, so one
GIN index answers the session, the speaker, the days and the words at once (`:C`, `:B`
in the query); the text's terms keep the default weight D.

Why not `pg_trgm`: a trigram index cannot find a two-character Chinese word (it has no
trigram), so the most common query becomes a scan of the session; measured in
bench/bench_recall.py --db (README, "Recall").

Indexed as it is stored, in the message's own transaction: with several processes
writing, ids commit out of order, so a batch watermark as on SQLite would skip rows.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Sequence

from . import search

MAX_POSITION = 16383
"""PostgreSQL's largest tsvector position. A text's terms after it are not indexed: it also
keeps a huge paste's tsvector far below PostgreSQL's 1 MB limit, so storing never fails."""

MAX_TERM_CHARS = 500
"""A term's characters in the index: PostgreSQL refuses a tsvector word over 2,046 bytes (a
pasted base64 blob, a long link), which would refuse the message itself. A longer term is
indexed by its head, and a query word's term that long is a prefix of its head, so it also
finds a term indexed whole before the cut."""

MAX_DOC_BYTES = 900_000
"""An upper bound of a document's tsvector size: PostgreSQL refuses one over 1 MB, which would
refuse the message itself. MAX_POSITION alone does not keep it there when the terms are long
(16,000 distinct words of 500 letters: 8 MB), so the text's terms after this are not indexed.
Counted per distinct term as its bytes and 8 more (its entry, alignment, position count), and
2 per position."""

INSERT = "INSERT INTO search_index (id, doc) VALUES (?, CAST(CAST(? AS TEXT) AS tsvector))"
REQUOTE = "UPDATE search_index SET doc = CAST(CAST(? AS TEXT) AS tsvector) WHERE id = ?"
FORGET = "DELETE FROM search_index WHERE id IN (SELECT id FROM messages WHERE session_id = ?)"
MARK_CLEARED = (
    "INSERT INTO search_cleared (session_id, upto)"
    " SELECT ?, COALESCE(MAX(id), 0) FROM messages WHERE session_id = ?"
    " ON CONFLICT (session_id) DO UPDATE SET upto = GREATEST(search_cleared.upto, excluded.upto)"
)


def select_candidates(withdrawn: bool) -> str:
    """The newest matches, re-checked against the session, the cleared watermark and the time
    (and without what was withdrawn, unless `withdrawn`)."""
    return (
        "SELECT m.id, m.role, m.content FROM search_index s JOIN messages m ON m.id = s.id"
        " WHERE s.doc @@ CAST(CAST(? AS TEXT) AS tsquery) AND m.session_id = ? AND m.id > ?"
        f" AND m.ts >= ? AND m.ts < ?{'' if withdrawn else ' AND m.withdrawn = 0'} ORDER BY s.id DESC LIMIT ?"
    )


def session_term(session_id: str) -> str:
    """One index term standing for the session (a hash: session ids contain separators)."""
    return "s" + hashlib.blake2b(session_id.encode(), digest_size=8).hexdigest()


def neighbours(columns: str, withdrawn: bool = False) -> str:
    """For each hit, up to N conversation messages of the session before and after it: the
    hits as an array (the first `?`), each joined laterally to its four index ranges of
    (session_id, archived, id), so the statement is the same for any number of hits and
    planned once (40 unions planned per call cost more than the whole search). Parameters
    after the array, per part: session id, watermark, N."""
    cols = ", ".join(f"n.{c}" for c in columns.split(", "))
    shown = "" if withdrawn else " AND withdrawn = 0"
    parts = []
    for after, (op, order) in enumerate((("<", "DESC"), (">", "ASC"))):
        for archived in (0, 1):
            parts.append(
                f"SELECT {after} AS after, {columns} FROM (SELECT {columns} FROM messages"
                f" WHERE session_id = ? AND archived = {archived} AND id {op} h.hit AND id > ?"
                f" AND event_marker = 0 AND role IN {search.SEARCH_ROLES!r} AND trim(content) != ''"
                f"{shown} ORDER BY id {order} LIMIT ?) AS p{after}{archived}"
            )
    return (
        f"SELECT CAST(2 * (h.n - 1) + n.after AS INTEGER), {cols}"
        " FROM unnest(CAST(? AS BIGINT[])) WITH ORDINALITY AS h(hit, n)"
        f" CROSS JOIN LATERAL ({' UNION ALL '.join(parts)}) AS n"
    )


def _quote(term: str) -> str:
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def document(session_id: str, role: str, name: str | None, content: str, ts: float) -> str:
    """The tsvector literal of a message: text terms, then the speaker's (C), then the session's (B)."""
    body, who = search.document_terms(role, name, content)
    session = session_term(session_id)
    sess = [session, search.day_term(session, ts)]
    parts: list[str] = []
    pos = 0
    size = 0
    seen: set[str] = set()
    for terms, weight in ((body, ""), (who, "C"), (sess, "B")):
        pos += 1  # a gap: no phrase runs from one part into the next
        kept = terms[: MAX_POSITION - 64] if weight == "" else terms
        for term in kept:
            head = term[:MAX_TERM_CHARS]
            if weight == "":
                size += 2 if head in seen else len(head.encode()) + 10
                seen.add(head)
                if size > MAX_DOC_BYTES:  # the speaker's and the session's terms still go in
                    break
            pos += 1
            parts.append(f"{_quote(head)}:{min(pos, MAX_POSITION)}{weight}")
    return " ".join(parts)


def _words(text: str, weight: str) -> list[str]:
    out = []
    for word in search.query_split(text):
        found = search.phrase_terms(word)
        if found is None:
            continue
        terms, prefix = found
        phrases = [_phrase(form, prefix, weight) for form in search.spellings(terms)]
        out.append("(" + " | ".join(phrases) + ")")
    return out


def _phrase(terms: list[str], prefix: bool, weight: str) -> str:
    lexemes = [
        f"{_quote(t[:MAX_TERM_CHARS])}:{'*' if len(t) > MAX_TERM_CHARS else ''}{weight}" for t in terms
    ]
    if prefix:
        lexemes[-1] = f"{_quote(terms[-1][:MAX_TERM_CHARS])}:*{weight}"
    return "(" + " <-> ".join(lexemes) + ")"


def tsquery(query: search.SearchQuery) -> str | None:
    """The query as a tsquery literal, or None when neither the text nor the speaker holds a term
    (the same rules as `SearchQuery.expression` on SQLite)."""
    parts = _words(query.text, "D")
    if query.speaker is not None:
        who = _words(query.speaker, "C")
        people = [f"{_quote(qq)}:C" for qq in query.speaker_ids if qq.isdigit()]
        if alternatives := (["(" + " & ".join(who) + ")"] if who else []) + people:
            parts.append("(" + " | ".join(alternatives) + ")")
    if not parts:
        return None
    session = session_term(query.session_id)
    days = query._days()
    if days is not None:
        parts.append(
            "(" + " | ".join(f"{_quote(search.day_term(session, d * search.DAY))}:B" for d in days) + ")"
        )
    return " & ".join([*parts, f"{_quote(session)}:B"])


_TF_A = float(f"{search.BM25_K1 + 1:g}")
_TF_B = float(f"{search.BM25_K1 * (search.BM25_K1 + 1):g}")
"""bm25's saturation c·(k1 + 1)/(c + k1) as SQLite's statement writes it: a − b/(c + k1), with
the constants as its text carries them, so both engines compute the very same floats."""
_LABELLED = re.compile(r"\[.*\([0-9].*\)\].*", re.DOTALL)
"""SQLite's `GLOB '[[]*([0-9]*)]*'`: a user message that starts with a `[昵称(ID)]` label."""
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def ranked_body(role: str, content: str) -> str:
    """The text a candidate is ranked on, exactly as SQLite's statement takes it
    (`search._BODY`): a user message without its label (up to the first `]`, then the
    spaces), lower-cased as SQLite's lower() does (ASCII letters only, no NFKC)."""
    if role == "user" and _LABELLED.fullmatch(content):
        content = content[content.index("]") + 1 :].lstrip(" ")
    return content.translate(_ASCII_LOWER)


def relevance(words: Sequence[str], role: str, content: str) -> float:
    """How well a candidate matches the query words (higher is better): the ranking SQLite's
    statement computes (`search.search_statement`: each word's count saturated as bm25
    does, summed, times the length prior), here in Python over the candidates' texts, on
    the same text and in the same float operations, so both engines rank alike."""
    body = ranked_body(role, content)
    total = 0.0
    for w in words:
        total += _TF_A - _TF_B / (max(1, body.count(w)) + search.BM25_K1)
    return total * min(len(body), search.PRIOR_CHARS) / float(search.PRIOR_CHARS)
