"""What the store refused (a full disk, the database away): the pure bookkeeping of
onebot/state.py's Refusals. The whole path (refused, the store back, fetched again and
stored once each) runs on the real bot in tests/test_audit5_m.py (SQLite, a full disk) and
tests/test_audit5_o.py (PostgreSQL going away)."""

from __future__ import annotations

from nonebot_plugin_memsum.onebot.state import PLACES_KEPT, REFUSALS_EVERY, Refusals


def test_one_line_a_minute_and_the_count_starts_over_once_stored() -> None:
    r = Refusals()
    assert r.refused(100.0, "s1", 5.0)
    assert not r.refused(100.0 + REFUSALS_EVERY - 1, "s1", 6.0)
    assert r.refused(100.0 + REFUSALS_EVERY, "s2", 7.0)
    assert r.stored() == 3
    assert r.total == 0
    # The places stay until each is fetched again: the first refusal's time is kept.
    assert r.places == {"s1": 5.0, "s2": 7.0}


def test_the_places_kept_are_bounded_and_a_known_one_keeps_its_first_time() -> None:
    r = Refusals()
    for i in range(PLACES_KEPT + 5):
        r.refused(0.0, f"s{i}", float(i))
    assert len(r.places) == PLACES_KEPT
    assert f"s{PLACES_KEPT}" not in r.places
    r.refused(0.0, "s0", 99.0)
    assert r.places["s0"] == 0.0


def test_a_refusal_without_a_session_counts_and_remembers_no_place() -> None:
    r = Refusals()
    r.refused(0.0)
    assert r.total == 1
    assert r.places == {}
