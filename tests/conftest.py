import pytest
from nonebug import NONEBOT_INIT_KWARGS


def pytest_configure(config: pytest.Config) -> None:
    config.stash[NONEBOT_INIT_KWARGS] = {"superusers": {"10001"}, "nickname": {"小记"}, "command_start": {"/"}}
