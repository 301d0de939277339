"""The simulator's checkpoint storage: checkpoints written on notice share the bandwidth."""

from __future__ import annotations

from timeshare.sim.storage import CheckpointStorage


def test_alone_a_checkpoint_takes_its_declared_time():
    s = CheckpointStorage(None)
    s.add("a", 1, 256.0, 79, 1_000)
    assert s.next_finish() == (80_000, "a")
    assert s.finished("a", 80_000) and not s.finished("a", 79_999)


def test_checkpoints_written_together_share_the_bandwidth():
    # two 100 GB checkpoints declared in 10 s each (10 GB/s) on a 10 GB/s storage: 5 GB/s each,
    # so each takes 20 s; the demand peaks at the bandwidth
    s = CheckpointStorage(10.0)
    s.add("a", 1, 100.0, 10, 0)
    s.add("b", 1, 100.0, 10, 0)
    assert s.next_finish() == (20_000, "a")
    assert s.peak_gbps == 10.0


def test_a_checkpoint_that_ends_gives_its_share_to_the_others():
    s = CheckpointStorage(10.0)
    s.add("a", 1, 50.0, 10, 0)    # wants 5 GB/s
    s.add("b", 1, 200.0, 10, 0)   # wants 20 GB/s: gets 5 while a writes
    assert s.next_finish() == (10_000, "a")
    assert s.finished("a", 10_000)
    s.remove("a", 10_000)
    # b wrote 50 GB in 10 s; 150 GB left at 10 GB/s: 15 s more
    assert s.next_finish() == (25_000, "b")
    assert s.hourly_peak_gbps(3_600_000) == [10.0]
