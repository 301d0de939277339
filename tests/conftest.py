"""Shared test setup. Being a conftest of the ``tests`` package, this puts the repository root on
``sys.path`` however pytest is started, so tests import their helpers as ``tests.builders`` and
``tests.invariants``."""
