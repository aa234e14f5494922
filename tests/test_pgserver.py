"""The PostgreSQL test server itself (tests/fakes/pgserver.py): a real server, reached over
TCP with a password, a fresh database per test, dropped afterwards."""

import subprocess

import pytest

from tests.fakes.pgserver import PgServer


def test_fresh_database_per_test_over_tcp_with_password(pg_server: PgServer, pg_url: str) -> None:
    assert pg_url.startswith("postgresql://memsum:")
    name = pg_url.rsplit("/", 1)[1]
    assert pg_server.psql("SELECT current_database()", name) == name
    assert pg_server.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", name) == "0"
    assert int(pg_server.psql("SHOW server_version_num")) >= 150000


def test_a_wrong_password_is_refused(pg_server: PgServer) -> None:
    bad = pg_server.url().replace(":memsum-test-pw@", ":wrong@")
    with pytest.raises(subprocess.CalledProcessError) as err:
        pg_server.psql("SELECT 1", url=bad)
    assert "password authentication failed" in (err.value.stderr or "")
