"""CPU per OneBot event through the real adapter, NoneBot's dispatch and the plugin.

    .venv/bin/python bench/bench_ingest.py [--groups 1000] [--plain 5000] [--addressed 300]
        [--notices 1000] [--at-once 4] [--profile plain]

bot.py itself is loaded (its logging, the plugin, other settings from the environment)
in this process with a started runtime on a real SQLite file; each event is a JSON text
parsed by the adapter's `json_to_event` and handled in a task of its own, as the
adapter's WebSocket loop does, `--at-once` events in flight at a time. Only the
implementation's side is stubbed: API calls (names, sends, history) answer at once,
and the model is soak.py's (no faults) in a process of its own, so its CPU is not counted.

Prints process CPU (every thread: the SQLite worker too) and wall time per event for:
ordinary group messages (every group seen once before, as in a long run), messages
that address the bot (the turn included: sent answer and all), and notices. A quick,
repeatable before/after for `bench/soak.py`'s CPU figure; the WebSocket itself is not
in it (about 0.2 ms per event in the soak's profile).
"""

# ruff: noqa: T201

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import json
import os
import pstats
import random
import runpy
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.soak import start_model

SELF_ID = 10000


class Payloads:
    """OneBot v11 events as an implementation sends them (NapCat's shape)."""

    def __init__(self, groups: int, seed: int) -> None:
        self.groups = groups
        self.rng = random.Random(seed)
        self.ids = itertools.count(1)

    def _group(self) -> int:
        return 900000 + self.rng.randrange(self.groups)

    def message(self, group: int | None = None, *, addressed: bool = False) -> str:
        mid = next(self.ids)
        uid = 20000 + self.rng.randrange(5)
        words = f"M{mid} 今天天气不错，我们下午去爬山吧，谁一起"
        segments = [{"type": "text", "data": {"text": words}}]
        if addressed:
            segments = [
                {"type": "at", "data": {"qq": str(SELF_ID)}},
                {"type": "text", "data": {"text": " " + words}},
            ]
        return json.dumps(
            {
                "time": int(time.time()),
                "self_id": SELF_ID,
                "post_type": "message",
                "message_type": "group",
                "sub_type": "normal",
                "message_id": mid,
                "group_id": group or self._group(),
                "user_id": uid,
                "anonymous": None,
                "message": segments,
                "raw_message": words,
                "font": 0,
                "sender": {"user_id": uid, "nickname": f"成员{uid - 20000}", "card": "", "role": "member"},
            },
            ensure_ascii=False,
        )

    def notice(self) -> str:
        group = self._group()
        uid = 20000 + self.rng.randrange(5)
        kind = self.rng.choice(("increase", "poke", "recall"))
        base: dict[str, Any] = {"time": int(time.time()), "self_id": SELF_ID, "post_type": "notice"}
        if kind == "increase":
            body = {"notice_type": "group_increase", "sub_type": "approve", "operator_id": 0}
        elif kind == "poke":
            body = {"notice_type": "notify", "sub_type": "poke", "target_id": 20000}
        else:
            body = {"notice_type": "group_recall", "operator_id": uid, "message_id": 1}
        return json.dumps({**base, **body, "group_id": group, "user_id": uid})


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by name (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = "sqlite" if "connection_worker" in thread.name else thread.name.split("_")[0].split(" ")[0]
        found[name] = found.get(name, 0.0) + (int(stat[11]) + int(stat[12])) / ticks
    return found


def _answer_api(counter: itertools.count[int]):
    async def call_api(bot: Any, api: str, **data: Any) -> Any:
        if api in ("send_msg", "send_group_msg", "send_private_msg", "send_group_forward_msg"):
            return {"message_id": 10**8 + next(counter)}
        if api in ("get_group_member_info", "get_stranger_info"):
            uid = int(data.get("user_id", 0))
            return {"user_id": uid, "nickname": f"成员{uid - 20000}", "card": ""}
        if api in ("get_group_msg_history", "get_friend_msg_history"):
            return {"messages": []}
        if api == "get_msg":
            return {"message": []}
        return {}

    return call_api


async def _feed(bot: Any, adapter_cls: Any, raws: list[str], at_once: int) -> None:
    """As the adapter's WebSocket loop: parse, then handle in a task of its own."""
    pending: set[asyncio.Task[None]] = set()
    for raw in raws:
        event = adapter_cls.json_to_event(json.loads(raw))
        if event is None:
            continue
        pending.add(asyncio.create_task(bot.handle_event(event)))
        if len(pending) >= at_once:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    if pending:
        await asyncio.wait(pending)


async def _idle(runtime: Any) -> None:
    """Until no turn and no background compression runs."""
    agent, service = runtime.get().agent, runtime.get().compression
    while busy := [w.task for w in agent._workers.values() if not w.task.done()] + list(service._background):
        await asyncio.wait(busy)


async def run(args: argparse.Namespace, out: Any) -> None:
    import nonebot
    from nonebot.adapters.onebot.v11 import Adapter, Bot

    from nonebot_plugin_memsum import runtime

    driver = nonebot.get_driver()
    await driver._lifespan.startup()
    adapter = next(a for a in driver._adapters.values() if isinstance(a, Adapter))
    adapter._call_api = _answer_api(itertools.count()).__get__(adapter)  # type: ignore[method-assign]
    bot = Bot(adapter, str(SELF_ID))
    driver._bot_connect(bot)
    make = Payloads(args.groups, args.seed)

    # Every group once, as a long run has them: sessions, settings, names known.
    await _feed(bot, Adapter, [make.message(900000 + g) for g in range(args.groups)], args.at_once)
    await _idle(runtime)

    phases = [
        ("plain", [make.message() for _ in range(args.plain)]),
        ("addressed", [make.message(addressed=True) for _ in range(args.addressed)]),
        ("notices", [make.notice() for _ in range(args.notices)]),
    ]
    for name, raws in phases:
        if not raws:
            continue
        profile = cProfile.Profile() if args.profile == name else None
        cpu, wall, threads = time.process_time(), time.perf_counter(), _thread_cpu()
        if profile:
            profile.enable()
        await _feed(bot, Adapter, raws, args.at_once)
        await _idle(runtime)
        if profile:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = _thread_cpu()
        split = ", ".join(
            f"{name} {(t - threads.get(name, 0.0)) * 1000 / len(raws):.2f}"
            for name, t in sorted(after.items())
        )
        print(
            f"{name:10s} {len(raws):6d} events: CPU {cpu * 1000 / len(raws):6.3f} ms/event,"
            f" wall {wall * 1000 / len(raws):6.3f} ms/event (by thread: {split})",
            file=out,
            flush=True,
        )
        if profile:
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(30)
            print(text.getvalue(), file=out)
    driver._bot_disconnect(bot)
    await driver._lifespan.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU per OneBot event through NoneBot and the plugin.")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--plain", type=int, default=5000)
    parser.add_argument("--addressed", type=int, default=300)
    parser.add_argument("--notices", type=int, default=1000)
    parser.add_argument("--at-once", type=int, default=4, help="events in flight at a time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", choices=("plain", "addressed", "notices"), help="cProfile one phase")
    parser.add_argument("--bot", type=Path, default=REPO / "bot.py", help="another checkout's bot.py")
    args = parser.parse_args()
    bot_py = args.bot.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="memsum-ingest-"))
    model, base_url = start_model(workdir, faults=False, seed=args.seed)  # answers in 0.3–2 s
    model_cfg = {"id": "bench/model", "base_url": base_url, "api_key": "sk-bench", "context_window": 32000}
    env = {
        "DRIVER": "~fastapi",
        "LOG_LEVEL": "INFO",
        "NICKNAME": '["小记"]',
        "COMMAND_START": '["/"]',
        "MEMSUM_MODELS": json.dumps([model_cfg]),
        "MEMSUM_HISTORY_LIMIT": "40",
        "LOCALSTORE_DATA_DIR": str(workdir / "data"),
        "LOCALSTORE_CACHE_DIR": str(workdir / "cache"),
        "LOCALSTORE_CONFIG_DIR": str(workdir / "config"),
    }
    (workdir / ".env").write_text("".join(f"{k}='{v}'\n" for k, v in env.items()), "utf-8")
    os.chdir(workdir)  # the .env above, no pyproject.toml
    out = sys.stdout
    log = (workdir / "bot.log").open("w", encoding="utf-8")
    sys.stdout = log  # bot.py logs to stdout: into the file, as a real bot's log
    try:
        sys.path.insert(0, str(bot_py.parent))
        runpy.run_path(str(bot_py), run_name="bench")
        print(f"bench_ingest: {bot_py}, {args.groups} groups, {args.at_once} at once", file=out)
        asyncio.run(run(args, out))
    finally:
        sys.stdout = out
        log.close()
        model.kill()
    size = (workdir / "bot.log").stat().st_size
    with sqlite3.connect(workdir / "data" / "nonebot_plugin_memsum" / "memsum.db") as db:
        stored = db.execute("SELECT role, COUNT(*) FROM messages GROUP BY role ORDER BY role").fetchall()
    print(f"stored: {', '.join(f'{n} {role}' for role, n in stored)}; log: {size / 1024:.1f} KB ({workdir})")


if __name__ == "__main__":
    main()
