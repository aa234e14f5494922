"""One exception tree (errors.py): every error the plugin raises on purpose is a
MemsumError, and the tree drawn in the module's docstring is the real one."""

from __future__ import annotations

import re

import nonebot_plugin_memsum.errors as errors_module
from nonebot_plugin_memsum import api, errors
from nonebot_plugin_memsum.llm import errors as llm_errors


def drawn_tree() -> dict[str, str]:
    """Each class drawn in the docstring → the class drawn above it (by indentation)."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors_module.__doc__ or "").splitlines():
        m = re.match(r"^([ │├└─]*)([A-Z]\w+)\b", line)
        if m is None or ("── " not in line and m.group(2) != "MemsumError"):
            continue
        depth, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def test_the_drawing_is_the_tree() -> None:
    classes = {**vars(errors), **vars(llm_errors)}
    drawn = drawn_tree()
    assert len(drawn) >= 16
    for name, parent in drawn.items():
        cls, base = classes[name], classes[parent]
        assert base in cls.__bases__, f"{name} is drawn under {parent}"


def test_every_error_class_of_the_package_is_in_the_tree() -> None:
    drawn = set(drawn_tree()) | {"MemsumError"}
    for module in (errors, llm_errors):
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, Exception)
                and value.__module__ == module.__name__
            ):
                assert issubclass(value, errors.MemsumError), name
                assert name in drawn, f"{name} is missing from the drawing"


def test_the_api_exposes_the_base() -> None:
    assert api.MemsumError is errors.MemsumError
    assert issubclass(api.CompressionCancelled, api.CompressionError)
    assert issubclass(api.StoreError, api.MemsumError)
