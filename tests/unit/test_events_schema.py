"""Every event type round-trips through msgspec JSON, and schemas/events.schema.json is the
JSON Schema the code describes now (stale -> run ``make schemas``)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from timeshare import events as ev
from timeshare.workload import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC = WorkloadSpec(id="w-1", submit_s=120, project="prior/olmo/pretrain", user="u17", gpu_type="H100", gpus=64,
                    work_s=86400, min_runtime_s=14400, resumable=True, priority="high", kind="training",
                    checkpoint_interval_s=1800, command=["python", "train.py"], checkpoint_on_notice_s=90,
                    checkpoint_gb=256.0)
BASE = {"event_id": "e1", "at_ms": 1_000, "cluster": "c1"}

EXAMPLES = [
    ev.WorkloadSubmitted(**BASE, workload=SPEC),
    ev.WorkloadSubmitted(**BASE, workload=SPEC, resubmit_of="w-0"),
    ev.WorkloadStarted(**BASE, workload_id="w-1", project="p/x", gpu_type="H100", gpus=16,
                       placement=[ev.NodeGpus(node="H100-000", gpu_ids=list(range(8))),
                                  ev.NodeGpus(node="H100-001", gpu_ids=list(range(8)))],
                       allocated=True, protected_until_ms=3_601_000, progress_s=1800, attempt=2),
    ev.WorkloadStarted(**BASE, workload_id="w-1", project="p/x", gpu_type="H100", gpus=1,
                       placement=[ev.NodeGpus(node="H100-000", gpu_ids=[3])], allocated=False,
                       protected_until_ms=None, non_preemptible=True),
    ev.MinRuntimeReached(**BASE, workload_id="w-1"),
    ev.WorkloadPreempted(**BASE, workload_id="w-1", resumable=True, progress_s=1800, lost_gpu_s=960,
                         reason=ev.PreemptionReason(
                             kind="fair_share", by_workload_id="w-2", by_project="q", level="",
                             preemptor_subtree="q", victim_subtree="p", preemptor_ratio=0.25, victim_ratio=1.5,
                             preemptor_fill=0.5, victim_fill=2.0, victim_running_gpus=64, victim_due_gpus=32.5,
                             hysteresis=0.05, message="why")),
    ev.WorkloadPreempted(**BASE, workload_id="w-1", resumable=False, progress_s=0, lost_gpu_s=0,
                         reason=ev.PreemptionReason(kind="drain", node="H100-003")),
    ev.WorkloadPreemptionNotice(**BASE, workload_id="w-1", deadline_ms=91_000, attempt=2,
                                reason=ev.PreemptionReason(kind="fair_share", by_workload_id="w-2", by_project="q")),
    ev.WorkloadCheckpointed(**BASE, workload_id="w-1", attempt=2),
    ev.WorkloadPreempted(**BASE, workload_id="w-1", resumable=True, progress_s=3600, lost_gpu_s=0,
                         checkpoint_gpu_s=5760, checkpointed=True, state_saved=False,
                         reason=ev.PreemptionReason(kind="fair_share", by_workload_id="w-2")),
    ev.WorkloadRequeued(**BASE, workload_id="w-1", progress_s=1800),
    ev.WorkloadCompleted(**BASE, workload_id="w-1", exit_code=0, attempt=3),
    ev.WorkloadFailed(**BASE, workload_id="w-1", reason="exit code 2", exit_code=2, attempt=1),
    ev.WorkloadCancelled(**BASE, workload_id="w-1", by="u17"),
    ev.NodeUnhealthy(**BASE, node="H100-003", reason="XID 79", needs_human=True),
    ev.NodeFailed(**BASE, node="H100-003", reason="kernel panic"),
    ev.NodeDrained(**BASE, node="H100-003"),
    ev.NodeRepaired(**BASE, node="H100-003"),
    ev.BudgetChanged(**BASE, by="lead", reason="quarterly",
                     changed={"a": ev.ShareChange(old=1.0, new=2.0), "b": ev.ShareChange(old=None, new=1.0)}),
    # as changes were written before they carried only what changed
    ev.BudgetChanged(**BASE, by="lead", reason="quarterly", old={"a": 1.0}, new={"a": 2.0, "b": 1.0}),
]


def test_the_examples_cover_every_event_type():
    assert {type(e) for e in EXAMPLES} == set(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: f"{ev.event_type(e)}")
def test_every_event_round_trips_through_json(event):
    data = ev.encoder.encode(event)
    assert json.loads(data)["type"] == ev.event_type(event)
    back = ev.decoder.decode(data)
    assert back == event and type(back) is type(event)


def test_event_tags_are_unique_and_name_their_subject():
    tags = [t.__struct_config__.tag for t in ev.EVENT_TYPES]
    assert len(set(tags)) == len(tags)
    assert all(tag.split(".")[0] in ("workload", "node", "budget") for tag in tags)


def test_old_logs_without_new_fields_still_decode():
    e = ev.decoder.decode(b'{"type":"workload.completed","event_id":"e9","at_ms":5,"workload_id":"x"}')
    assert e.cluster == "default" and e.exit_code == 0 and e.attempt is None


def test_an_unknown_event_type_is_refused():
    with pytest.raises(msgspec.ValidationError):
        ev.decoder.decode(b'{"type":"workload.exploded","event_id":"e1","at_ms":0}')


def test_the_json_schema_names_every_event_type():
    schema = ev.json_schema()
    refs = {r["$ref"].rsplit("/", 1)[-1] for r in schema["anyOf"]}
    assert refs == {t.__name__ for t in ev.EVENT_TYPES}
    assert set(refs) <= set(schema["$defs"])


def test_schemas_events_schema_json_is_fresh():
    path = ROOT / "schemas" / "events.schema.json"
    expected = json.dumps(ev.json_schema(), indent=2, sort_keys=True) + "\n"
    assert path.exists(), "schemas/events.schema.json is missing: run `make schemas`"
    assert path.read_text() == expected, "schemas/events.schema.json is stale: run `make schemas`"
