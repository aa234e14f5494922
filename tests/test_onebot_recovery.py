"""The backfill's order on connect (issue 15): what a live message waits for is fetched first."""

from nonebot_plugin_memsum.onebot.recovery import next_session


def test_the_backfill_takes_sessions_oldest_first() -> None:
    todo = {"a": 1.0, "b": 2.0, "c": 3.0}
    taken = [next_session(todo, {}) for _ in range(4)]
    assert taken == [("a", 1.0), ("b", 2.0), ("c", 3.0), None]


def test_a_session_a_live_message_waits_for_is_fetched_next() -> None:
    # A message said just after the reconnect must not wait for a thousand groups' history.
    todo = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    wanted = {"d": None, "gone": None, "c": None}  # "gone": fetched already, or never planned
    assert next_session(todo, wanted) == ("d", 4.0)
    assert next_session(todo, wanted) == ("c", 3.0)
    assert wanted == {}
    assert next_session(todo, wanted) == ("a", 1.0)
    wanted["a"] = None  # taken already: the next in line comes
    assert next_session(todo, wanted) == ("b", 2.0)
    assert next_session(todo, wanted) is None
