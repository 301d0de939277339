"""Shared test setup. Being a conftest of the ``tests`` package, this puts the repository root on
``sys.path`` however pytest is started, so tests import their helpers as ``tests.builders`` and
``tests.invariants``."""


def pytest_terminal_summary(terminalreporter):
    """How many inputs the fuzz tests tried (tests/integration/test_fuzz.py, tests/unit/test_fuzz_bus.py)."""
    import sys

    tried = {}
    for name, mod in list(sys.modules.items()):
        if name.rsplit(".", 1)[-1] in ("test_fuzz", "test_fuzz_bus") and mod is not None:
            tried.update(getattr(mod, "TRIED", {}))
    if tried:
        terminalreporter.write_line("fuzz: " + ", ".join(f"{k} {v}" for k, v in sorted(tried.items())))
