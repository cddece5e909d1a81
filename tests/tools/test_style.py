"""The size limits of docs/contributing.md, on everything that ships (sparsecomm/; the
repository's benchmarks/ does not): no class over 150 lines, no function over 60. ruff and clang-format run in
`make lint`, before the suite."""

import ast
import pathlib

import paths
import pytest

ROOT = pathlib.Path(paths.ROOT) / "sparsecomm"
LIMITS = {ast.ClassDef: 150, ast.FunctionDef: 60, ast.AsyncFunctionDef: 60}


def oversized(source):
    """(kind, name, lines) of every class and function of `source` over its limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        limit = LIMITS.get(type(node))
        if limit is not None and node.end_lineno - node.lineno + 1 > limit:
            found.append((type(node).__name__, node.name, node.end_lineno - node.lineno + 1))
    return found


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")),
)
def test_no_class_or_function_is_over_its_limit(path):
    assert oversized((ROOT / path).read_text()) == []


def test_the_check_sees_an_oversized_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert oversized(f"def f():\n{body}\n") == [("FunctionDef", "f", 61)]
    assert oversized(f"def f():\n{body}\n"[: -len("    x59 = 59\n")]) == []
