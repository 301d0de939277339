"""The compiled core (benchmarks/compiled.py, mypyc) behaves exactly as pure Python: the same
scenarios give byte-identical event streams and the same metrics. Tests elsewhere run pure Python; this one builds
the compiled copy (or reuses the cached build of the same sources) and compares."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import compiled

ROOT = Path(__file__).resolve().parents[2]
AI2_LIKE = ROOT / "examples" / "ai2-like" / "scenario.toml"
PHILLY = ROOT / "tests" / "data" / "philly" / "scenario.toml"
CONTENDED = ROOT.parent / "shared" / "data" / "philly-seed0-contended" / "scenario.toml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def build() -> Path:
    if compiled.find_compiler() is None:
        pytest.skip("no C compiler found (CC, or Python's configured compiler): the compiled core cannot be built")
    path = compiled.build()
    assert not list((ROOT / "shared").rglob("*.so")), "compiled modules must never land in the source tree"
    return path


# the first 6 days of the built-in month have preemptions of every kind the budget policy makes
# (unallocated, fair share, drain), a node drain and repair, and a resubmission
@pytest.mark.parametrize(("scenario", "policy", "duration"), [
    (AI2_LIKE, "budget", "6d"),
    (AI2_LIKE, "baseline", "2d"),
    (PHILLY, "budget", None),
    (PHILLY, "fifo", None),
    pytest.param(CONTENDED, "budget", None, marks=pytest.mark.skipif(
        not CONTENDED.exists(), reason=f"{CONTENDED} not found (the shared data directory)")),
], ids=["ai2-like-6d-budget", "ai2-like-2d-baseline", "philly-head-budget", "philly-head-fifo",
        "philly-contended-budget"])
def test_compiled_core_gives_the_same_events_as_pure_python(build, scenario, policy, duration):
    pure = compiled.run_hash_in(None, str(scenario), policy, duration)
    fast = compiled.run_hash_in(build, str(scenario), policy, duration)
    assert pure["scheduler"].endswith("scheduler.py")
    assert fast["scheduler"].startswith(str(build)) and not fast["scheduler"].endswith(".py")
    assert pure["events"] > 100
    assert (fast["events"], fast["sha256"]) == (pure["events"], pure["sha256"])
    # the simulator's metrics are compiled too: the same metrics.json, to the type of each number
    assert pure["metrics_module"].endswith("metrics.py") and not fast["metrics_module"].endswith(".py")
    assert fast["metrics_sha256"] == pure["metrics_sha256"]
