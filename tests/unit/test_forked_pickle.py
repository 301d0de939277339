"""The snapshot's pickle made by a forked child: it holds the object as it was at the call."""

from __future__ import annotations

import asyncio
import pickle
import threading

import pytest

from services.common.forked_pickle import start_pickle


def test_the_child_pickles_the_object_as_it_was_when_started():
    state = {"workloads": list(range(200_000)), "name": "a"}
    job = start_pickle(state)
    # the parent goes on changing it before the bytes are read
    state["workloads"].append(-1)
    state["name"] = "b"
    data = asyncio.run(job.result())
    back = pickle.loads(data)
    assert back["name"] == "a"
    assert back["workloads"][-1] == 199_999
    assert len(back["workloads"]) == 200_000
    assert job.forked


def test_a_child_that_cannot_pickle_fails_the_job():
    job = start_pickle({"lock": threading.Lock()})  # locks cannot be pickled
    with pytest.raises(RuntimeError, match="exited with 1"):
        asyncio.run(job.result())
