"""The scheduling core is pure: no clock, no randomness, no I/O, no services. Checked by
parsing the imports of every core module (everything in shared/timeshare except sim/,
report/, importers/ and cli.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "shared" / "timeshare"
NOT_CORE_DIRS = {"sim", "report", "importers"}
NOT_CORE_FILES = {"cli.py"}
FORBIDDEN = {"asyncio", "os", "time", "datetime", "logging", "random", "socket", "subprocess", "services",
             "threading", "multiprocessing", "uuid", "secrets"}


def core_modules() -> list[Path]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in NOT_CORE_DIRS or (len(rel.parts) == 1 and rel.name in NOT_CORE_FILES):
            continue
        out.append(path)
    return out


def imported_roots(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append(("__import__", node.lineno))
    return found


def test_the_core_is_found():
    names = {p.name for p in core_modules()}
    assert {"tree.py", "window.py", "fairshare.py", "scheduler.py", "state.py", "placement.py"} <= names
    assert "engine.py" not in names and "cli.py" not in names


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_core_module_imports_nothing_impure(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [(name, line) for name, line in imported_roots(tree) if name in FORBIDDEN or name == "__import__"]
    assert not bad, f"{path.name} imports {bad}: the core must not read clocks, randomness, the OS or services"


def test_relative_imports_stay_inside_the_core():
    for path in core_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = (node.module or "").split(".")[0]
                assert target not in NOT_CORE_DIRS and target != "cli", f"{path.name} imports .{target}"
