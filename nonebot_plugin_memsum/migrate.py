"""Move a SQLite memory into PostgreSQL:

    python -m nonebot_plugin_memsum.migrate --from sqlite:PATH --to postgresql://user:password@host:port/db

Copies every table (store/migrate.py), verifies counts and checksums, prints a short
report. Safe to run again: a second run copies nothing and verifies again; a run that was
interrupted is finished by the next. Stop the bots that write the file first.
Exit status: 0 verified, 1 the copy does not verify or the target holds another memory,
2 a bad argument or a database that cannot be opened (one line, never the password).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from nonebot_plugin_memsum.errors import StoreError
from nonebot_plugin_memsum.store.engine import URL_SCHEMES, describe
from nonebot_plugin_memsum.store.migrate import CHUNK, MigrateError, migrate

PROG = "python -m nonebot_plugin_memsum.migrate"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not the usage block: argparse's messages never hold an argument's value.
        _fail(message)


def _fail(message: str, status: int = 2) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)  # noqa: T201
    raise SystemExit(status)


def _source(value: str) -> Path:
    if not value.startswith("sqlite:") or len(value) == len("sqlite:"):
        _fail("--from must be sqlite:PATH (the SQLite file of the plugin)")
    path = Path(value.removeprefix("sqlite:")).expanduser()
    if not path.is_file():
        _fail(f"--from: no such file: {path}")
    return path


def _target(value: str) -> str:
    # The URL holds a password: say what is wrong, never the value.
    form = "--to must look like postgresql://user:password@host:port/dbname"
    try:
        parts = urlsplit(value)
        parts.port
    except ValueError:
        _fail(form + " (the port is not a number)")
    if parts.scheme not in URL_SCHEMES or not parts.hostname or len(parts.path) < 2:
        _fail(form)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description="Copy a SQLite memory into PostgreSQL, then verify it.")
    parser.add_argument("--from", dest="source", required=True, metavar="sqlite:PATH")
    parser.add_argument("--to", dest="target", required=True, metavar="postgresql://…")
    parser.add_argument(
        "--chunk", type=int, default=CHUNK, metavar="ROWS", help=f"rows per transaction (default {CHUNK})"
    )
    args = parser.parse_args(argv)
    if args.chunk < 1:
        _fail("--chunk must be at least 1")
    source, target = _source(args.source), _target(args.target)
    print(f"{source} -> {describe(target)}")  # noqa: T201
    try:
        report = asyncio.run(migrate(source, target, lambda step: print(f"  {step}", flush=True), args.chunk))  # noqa: T201
    except StoreError as err:
        _fail(str(err))
    except MigrateError as err:
        _fail(str(err), 1)
    for line in report.lines():
        print(line)  # noqa: T201
    if not report.verified:
        print("NOT VERIFIED: the target differs from the file (see above); nothing in the file was changed")  # noqa: T201
        return 1
    print("verified: every table has the same rows and checksum on both sides")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
