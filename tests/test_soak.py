"""The soak of bench/soak.py, small, as a correctness test (issue 15): bot.py as a real
process, a few groups talking, one SIGKILL at half time and an immediate restart.
Nothing lost, nothing duplicated, what was said while the bot was down recorded in
order, every question answered exactly once. Timings stay in the benchmark."""

from __future__ import annotations

from pathlib import Path

from bench.soak import run


async def test_a_sigkill_at_half_time_loses_nothing_and_answers_every_question_once(tmp_path: Path) -> None:
    r = await run(tmp_path, groups=4, rate=4, seconds=16, kill_at=0.5, faults=False, warmup=0, settle=10)
    assert r.said_while_down > 0, r.report()  # the kill really hid some of the talk
    assert r.questions > 0, r.report()
    assert (r.lost, r.duplicated, r.out_of_order, r.down_not_recorded) == (0, 0, 0, 0), r.report()
    assert (r.unanswered, r.answered_twice) == (0, 0), r.report()
    assert r.text_lines == 0, r.report()  # nothing said reaches the log at INFO
    # The overhead's attribution: by process life, and the model's time on the question's
    # session (which holds the answer's own request) never less than on its prompt.
    assert "life 1" in {w.life for w in r.waits} <= {"life 1", "life 2", "resumed"}, r.report()
    assert all(w.net_ms <= w.raw_ms + 2 for w in r.waits), r.report()
