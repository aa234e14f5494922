"""Runs bot.py in this interpreter, killed right before its Nth database write: a
`BotProcess.wrapper` for the OneBot half of the kill-point sweep (tests/test_audit12_ck.py).

    python tests/fakes/killshim.py N WRITES_LOG <python> <bot.py>

`sqlite3.connect` is wrapped so that every connection to the bot's `memsum.db` counts its
INSERT / UPDATE / DELETE / REPLACE / COMMIT statements in its trace callback (called by SQLite
right before each runs) and `os._exit(137)`s before the Nth (0: never). Each write is
appended to WRITES_LOG first (`N SQL`), flushed, so the parent knows what the point was. The
product is not touched: only this process's sqlite3 module.
"""

from __future__ import annotations

import os
import runpy
import sqlite3
import sys
from pathlib import Path
from typing import Any

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "COMMIT")


def main() -> None:
    kill_at, log, bot_py = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[4]
    written = 0
    out = log.open("a", encoding="utf-8")
    connect = sqlite3.connect

    def trace(sql: str) -> None:
        nonlocal written
        if sql.lstrip().split(" ", 1)[0].upper() not in WRITES:
            return
        written += 1
        if written == kill_at:
            out.write(f"kill {written} {' '.join(sql.split())[:400]}\n")
            out.flush()
            os._exit(137)
        out.write(f"{written} {' '.join(sql.split())[:400]}\n")
        out.flush()

    def counted(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(database, *args, **kwargs)
        if str(database).endswith("memsum.db"):
            conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = counted
    sys.argv = [bot_py]
    sys.path.insert(0, str(Path(bot_py).parent))
    runpy.run_path(bot_py, run_name="__main__")


if __name__ == "__main__":
    main()
