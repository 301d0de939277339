"""The live system's CLI (services/cli.py) without a server: what a user can type wrong is one line
``timeshare: argument ...`` on stderr, exit status 2, nothing sent; what it prints is read from
canned gateway answers (httpx.MockTransport): UTC times, filters, the report table, ``--json``."""

from __future__ import annotations

import json
import os
import sys
import time

import httpx
import pytest

import services.cli as cli
from timeshare.cli import main


@pytest.fixture
def gateway(monkeypatch):
    """A fake gateway: ``answers[(method, path)]`` is the JSON body; every request is kept."""
    seen: list[httpx.Request] = []
    answers: dict[tuple[str, str], object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        key = (request.method, request.url.path)
        if key not in answers:
            return httpx.Response(404, json={"detail": f"no canned answer for {key}"})
        return httpx.Response(200, json=answers[key])

    monkeypatch.setattr(cli, "_client", lambda args: httpx.Client(base_url="http://gateway.test",
                                                                  transport=httpx.MockTransport(handler)))
    return answers, seen


BAD = {
    "a duration that is a word": (["submit", "--project", "a/b", "--gpus", "1", "--work", "lots"],
                                  "argument --work: not a duration: 'lots'"),
    "a duration with an unknown unit word": (["submit", "--project", "a/b", "--gpus", "1", "--work", "2 fortnights"],
                                             "argument --work: not a duration: '2 fortnights' ('fortnights' is not a unit"),
    "a minimum runtime that is not a duration": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h",
                                                  "--min-runtime", "nan"], "argument --min-runtime: not a duration: 'nan'"),
    "no work": (["submit", "--project", "a/b", "--gpus", "1", "--work", "0"],
                "argument --work: expected a duration of at least 1 second, got '0'"),
    "negative work, as people type it": (["submit", "--project", "a/b", "--gpus", "1", "--work", "-2h"],
                                         "argument --work: expected a duration of at least 1 second, got '-2h'"),
    "negative work in seconds": (["submit", "--project", "a/b", "--gpus", "1", "--work", "-90"],
                                 "argument --work: expected a duration of at least 1 second, got '-90'"),
    "a state that does not exist": (["workloads", "--state", "bogus"],
                                    "argument --state: invalid choice: 'bogus' (choose from 'pending', 'running'"),
    "an uncordon without a node": (["nodes", "uncordon"], "the following arguments are required: node"),
    "negative GPUs": (["submit", "--project", "a/b", "--gpus", "-1", "--work", "1h"],
                      "argument --gpus: expected a whole number of at least 1, got '-1'"),
    "zero GPUs": (["submit", "--project", "a/b", "--gpus", "0", "--work", "1h"],
                  "argument --gpus: expected a whole number of at least 1, got '0'"),
    "GPUs that are a word": (["submit", "--project", "a/b", "--gpus", "lots", "--work", "1h"],
                             "argument --gpus: expected a whole number of at least 1, got 'lots'"),
    "an unknown priority": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h", "--priority", "top"],
                            "argument --priority: invalid choice: 'top'"),
    "a share that is a word": (["budget", "set", "x=lots", "--reason", "r"],
                               "argument PATH=SHARE: the share of 'x' must be a number >= 0, got 'lots'"),
    "a share that is nan": (["budget", "set", "x=nan", "--reason", "r"],
                            "argument PATH=SHARE: the share of 'x' must be a number >= 0, got 'nan'"),
    "a share that is infinite": (["budget", "set", "x=inf", "--reason", "r"],
                                 "argument PATH=SHARE: the share of 'x' must be a number >= 0, got 'inf'"),
    "a negative share": (["budget", "set", "x=-1", "--reason", "r"],
                         "argument PATH=SHARE: the share of 'x' must be a number >= 0, got '-1'"),
    "a share without '='": (["budget", "set", "x", "--reason", "r"],
                            "argument PATH=SHARE: expected PATH=SHARE (e.g. tulu/rl=4), got 'x'"),
    "a share without a path": (["budget", "set", "=2", "--reason", "r"], "argument PATH=SHARE: no path before '='"),
    "the same path twice": (["budget", "set", "x=1", "x=2", "--reason", "r"], "argument PATH=SHARE: 'x' given twice"),
    "a queue limit of zero": (["queue", "--limit", "0"], "argument --limit: expected a whole number of at least 1"),
    "a report start that is no time": (["budget", "report", "--from", "yesterday"],
                                       "argument --from: expected 'now', a duration ago like '2d'"),
    "a report range that ends before it starts": (["budget", "report", "--from", "1h", "--to", "2h"],
                                                  "argument --from: must be before --to"),
    "a notice that is a word": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h",
                                 "--checkpoint-on-notice", "soon"], "argument --checkpoint-on-notice: not a duration: 'soon'"),
    "a negative notice": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h", "--checkpoint-on-notice", "-90s"],
                          "argument --checkpoint-on-notice: expected a duration such as 90s or 2min, got '-90s'"),
    "a checkpoint size that is a word": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h",
                                          "--checkpoint-gb", "big"],
                                         "argument --checkpoint-gb: expected a size in GB (a number >= 0), got 'big'"),
    "a checkpoint size that is infinite": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h",
                                            "--checkpoint-gb", "inf"],
                                           "argument --checkpoint-gb: expected a size in GB (a number >= 0), got 'inf'"),
    "a checkpoint interval of zero": (["submit", "--project", "a/b", "--gpus", "1", "--work", "1h",
                                       "--checkpoint-every", "0"],
                                      "argument --checkpoint-every: expected a duration of at least 1 second, got '0'"),
    "an empty workload id": (["status", ""], "argument id: expected a name, got ''"),
    "a workload id that is a path step": (["cancel", ".."], "argument id: expected a name, got '..'"),
    "a node name that is a path step": (["nodes", "repair", "."], "argument node: expected a name, got '.'"),
}


@pytest.mark.parametrize("argv, message", BAD.values(), ids=BAD.keys())
def test_a_bad_value_is_one_line_naming_the_argument_exit_2_and_nothing_sent(argv, message, gateway, capsys):
    _, seen = gateway
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2
    assert err.startswith(f"timeshare: {message}") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    assert seen == []


@pytest.mark.parametrize("option, env, message", [
    (["--token", "tok-\u00e9"], None, "argument --token: a token is printable ASCII without spaces"),
    ([], "tok alice", "TIMESHARE_TOKEN: a token is printable ASCII without spaces"),
], ids=["a non-ASCII --token", "a TIMESHARE_TOKEN with a space"])
def test_a_token_that_cannot_be_a_header_is_one_line_exit_2(option, env, message, monkeypatch, capsys):
    monkeypatch.setattr(cli.httpx.Client, "request", lambda *a, **k: pytest.fail("sent a request"))
    if env is not None:
        monkeypatch.setenv("TIMESHARE_TOKEN", env)
    with pytest.raises(SystemExit) as stopped:
        main(["queue", *option])
    assert stopped.value.code == 2 and capsys.readouterr().err == f"timeshare: {message}\n"


@pytest.mark.parametrize("work, seconds", [("2hours", 7200), ("90min", 5400), ("1 day", 86400), ("45 sec", 45),
                                           ("2h30m", 9000)])
def test_submit_sends_durations_written_as_people_do_in_seconds(work, seconds, gateway, capsys):
    answers, seen = gateway
    answers["POST", "/v1/workloads"] = {"workload_id": "w-1", "cluster": "c", "state": "submitted", "replayed": False}
    assert main(["submit", "--project", "a/b", "--gpus", "2", "--work", work, "--min-runtime", "10 minutes"]) == 0
    body = json.loads(seen[0].content)
    assert (body["work_s"], body["min_runtime_s"], body["gpus"]) == (seconds, 600, 2)
    assert capsys.readouterr().out.startswith("submitted w-1 (2 x H100 for a/b")


def test_status_of_work_under_notice_says_until_when_its_gpus_are_held(gateway, capsys):
    answers, _ = gateway
    answers["GET", "/v1/workloads/w-1"] = dict(STATUS, notice={
        "at_ms": 1796135525000, "deadline_ms": 1796135615000, "by_workload_id": "w-2", "checkpointed_ms": None})
    assert main(["status", "w-1"]) == 0
    assert ("  under notice since 2026-12-01 14:32:05Z: checkpointing, GPUs free by 2026-12-01 14:33:35Z at the "
            "latest (for w-2)\n") in capsys.readouterr().out


def test_nodes_say_which_free_gpus_are_held_for_a_preemptor(gateway, capsys):
    answers, _ = gateway
    answers["GET", "/v1/nodes"] = {"nodes": [
        {"name": "H100-000", "gpu_type": "H100", "state": "healthy", "free": 0, "gpus": 4, "workloads": ["v"],
         "held": {"p": 2}},
        {"name": "H100-001", "gpu_type": "H100", "state": "healthy", "free": 4, "gpus": 4, "workloads": []}]}
    assert main(["nodes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith("v (2 held for p: its victims under notice checkpoint)") and "held" not in out[2]


def test_submit_sends_the_notice_fields_only_when_given(gateway, capsys):
    answers, seen = gateway
    answers["POST", "/v1/workloads"] = {"workload_id": "w-1", "cluster": "c", "state": "submitted", "replayed": False}
    assert main(["submit", "--project", "a/b", "--gpus", "8", "--work", "2h", "--resumable",
                 "--checkpoint-every", "30min", "--checkpoint-on-notice", "90s", "--checkpoint-gb", "40",
                 "--suspends-on-notice"]) == 0
    body = json.loads(seen[0].content)
    assert (body["checkpoint_interval_s"], body["checkpoint_on_notice_s"], body["checkpoint_gb"],
            body["suspends_on_notice"]) == (1800, 90, 40.0, True)
    # without them the body is the one sent before notices existed (same Idempotency-Key hash)
    assert main(["submit", "--project", "a/b", "--gpus", "8", "--work", "2h"]) == 0
    body = json.loads(seen[1].content)
    assert not {"checkpoint_interval_s", "checkpoint_on_notice_s", "checkpoint_gb", "suspends_on_notice"} & set(body)


STATUS = {"id": "w-1", "state": "running", "gpus": 4, "gpu_type": "H100", "project": "alpha/train", "user": "alice",
          "attempt": 1, "preemptions": 0, "submitted_ms": 1796135520000, "started_ms": 1796135525000,
          "ended_ms": None, "protected_until_ms": 1796136125000, "placement": [{"node": "H100-000", "gpu_ids": [0, 1, 2, 3]}],
          "last_reason": None,
          "history": [{"at_ms": 1796135520000, "type": "workload.submitted"},
                      {"at_ms": 1796135525000, "type": "workload.started"}]}


def test_status_prints_utc_times_whatever_the_local_zone(gateway, capsys, monkeypatch):
    answers, _ = gateway
    answers["GET", "/v1/workloads/w-1"] = STATUS
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30: a local time would show 20:02
    time.tzset()
    try:
        assert main(["status", "w-1"]) == 0
    finally:
        monkeypatch.undo()
        time.tzset()
    out = capsys.readouterr().out
    assert "  2026-12-01 14:32:00Z  workload.submitted\n  2026-12-01 14:32:05Z  workload.started" in out
    assert "first started 2026-12-01 14:32:05Z (after 5s)" in out
    assert "protected (minimum runtime) until 2026-12-01 14:42:05Z" in out
    assert "1796135520000" not in out


@pytest.mark.parametrize("argv, path, body", [
    (["status", "w-1"], "/v1/workloads/w-1", STATUS),
    (["budget", "report", "--from", "2d"], "/v1/report", {"from_s": 1, "to_s": 2, "a shape": "the CLI does not know"}),
], ids=["status", "the report, whatever its shape"])
def test_json_is_the_gateways_body_as_is(argv, path, body, gateway, capsys):
    answers, _ = gateway
    answers["GET", path] = body
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == body


def test_budget_history_prints_utc_times_and_what_changed(gateway, capsys):
    answers, _ = gateway
    answers["GET", "/v1/allocations/history"] = {"changes": [
        {"seq": 7, "at_ms": 1796135520000, "by": "root", "reason": "grow beta",
         "changed": {"beta": {"old": 1.0, "new": 2.0}, "beta/new": {"old": None, "new": 1.0},
                     "beta/old": {"old": 3.0, "new": None}}}],
        "older_before_seq": 7}
    assert main(["budget", "history"]) == 0
    assert capsys.readouterr().out == ("2026-12-01 14:32:00Z  root: grow beta  beta 1.0->2.0, beta/new added (1.0), "
                                       "beta/old removed (3.0; with everything below it)\n"
                                       "(older changes: timeshare budget history --before 7)\n")


def _queued(position, wid, project, user):
    return {"position": position, "workload_id": wid, "project": project, "user": user, "gpu_type": "H100", "gpus": 1,
            "phase": "allocated", "priority": "normal", "submitted_s": 1000, "queued_since_s": 1000,
            "ordering_key": [], "leaf_ratio": 0.5}


QUEUE = {"now_s": 1000 + 5400, "pending": 3, "workloads": [
    _queued(1, "w-a1", "alpha/train", "alice"), _queued(2, "w-b1", "beta/debug", "bob"),
    _queued(3, "w-a2", "alpha/eval", "bob")]}


@pytest.mark.parametrize("argv, shown", [
    (["--user", "bob"], ["w-b1", "w-a2"]),
    (["--project", "alpha"], ["w-a1", "w-a2"]),
    (["--project", "alpha/eval"], ["w-a2"]),
    (["--project", "alph"], []),
    (["--user", "bob", "--project", "alpha"], ["w-a2"]),
    (["--user", "bob", "--limit", "1"], ["w-b1"]),
], ids=["a user's", "a project's subtree", "one leaf", "a prefix of a name is not a subtree", "both filters",
        "the limit applies after the filter"])
def test_queue_filters_by_user_and_project_keeping_positions_in_the_whole_queue(argv, shown, gateway, capsys):
    answers, seen = gateway
    answers["GET", "/v1/queue"] = QUEUE
    assert main(["queue", *argv, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [w["workload_id"] for w in body["workloads"]] == shown
    assert body["pending"] == 3
    assert seen[0].url.params["limit"] == str(cli._QUEUE_MAX)  # the whole queue, filtered here


def test_queue_table_shows_user_and_waiting_time(gateway, capsys):
    answers, seen = gateway
    answers["GET", "/v1/queue"] = QUEUE
    assert main(["queue", "--project", "beta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("3 pending, 1 of project beta shown")
    assert lines[2].split() == ["2", "w-b1", "beta/debug", "bob", "1", "allocated", "0.500", "1h30m"]
    assert seen[0].url.params["limit"] == str(cli._QUEUE_MAX)


def test_a_closed_pipe_ends_quietly(gateway, capsys, monkeypatch):
    """`timeshare queue | head -1`: the reader is gone; no traceback, the status of SIGPIPE."""
    answers, _ = gateway
    answers["GET", "/v1/queue"] = QUEUE
    read_end, write_end = os.pipe()
    os.close(read_end)
    pipe = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", pipe)
    try:
        assert main(["queue"]) == 141
    finally:
        monkeypatch.undo()
        pipe.close()  # flushes what was buffered into /dev/null, which main put in place of the pipe
    assert capsys.readouterr().err == ""


REPORT = {"from_s": 1796135520 - 2 * 86400, "to_s": 1796135520.0,
          "teams": {"alpha/train": {"fraction": 0.5, "owed_gpu_hours": 10.0, "delivered_gpu_hours": 12.5, "attainment": 0.9},
                    "beta/debug": {"fraction": 0.5, "owed_gpu_hours": 0.0, "delivered_gpu_hours": 0.0, "attainment": None}},
          "attainment": {"fleet": 0.9, "min_team": 0.9, "teams_at_or_above_95": 0, "teams": 1},
          "occupancy": 0.75, "unallocated_share": 0.1, "preemptions": 2, "preemptions_by_reason": {"fair_share": 2},
          "queue_wait_s": {"count": 4, "mean": 60.0, "p50": 30.0, "p90": 600.0, "p99": 600.0, "max": 600.0},
          "wasted_gpu_hours": 1.25, "waste": {"lost_gpu_hours": 0.5, "checkpoint_gpu_hours": 0.75,
                                              "per_1000_delivered_gpu_hours": 100.0}}


def test_budget_report_asks_from_two_days_ago_to_the_ledgers_now_and_prints_a_table(gateway, capsys):
    answers, seen = gateway
    answers["GET", "/v1/report"] = REPORT
    before = time.time()
    assert main(["budget", "report", "--from", "2d", "--to", "now"]) == 0
    params = seen[0].url.params
    assert "to_s" not in params
    assert before - 2 * 86400 <= float(params["from_s"]) <= time.time() - 2 * 86400
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("GPU-hours owed and delivered, 2026-11-29 14:32:00Z to 2026-12-01 14:32:00Z")
    assert out[2].split() == ["alpha/train", "0.500", "10.00", "12.50", "90.0%"]
    assert out[3].split() == ["beta/debug", "0.500", "0.00", "0.00", "-"]
    assert out[4] == "fleet attainment 90.0%, lowest team 90.0%, 0 of 1 teams at or above 95%"
    assert out[5] == ("occupancy 75.0%, unallocated work 10.0% of busy GPUs, 2 preemptions (fair_share 2), "
                      "queue wait p50 30s p90 10m over 4 starts")
    assert out[6] == ("wasted 1.25 GPU-h: lost progress 0.50, checkpoints on notice 0.75 "
                      "(100.0 per 1,000 GPU-h delivered)")


def test_budget_report_takes_utc_dates(gateway, capsys):
    answers, seen = gateway
    answers["GET", "/v1/report"] = REPORT
    assert main(["budget", "report", "--from", "2026-11-29", "--to", "2026-12-01 14:32:00Z"]) == 0
    assert float(seen[0].url.params["from_s"]) == 1796135520 - 2 * 86400 - (14 * 3600 + 32 * 60)
    assert float(seen[0].url.params["to_s"]) == 1796135520


def test_workloads_asks_the_gateway_for_a_users_workloads_in_a_state(gateway, capsys):
    answers, seen = gateway
    answers["GET", "/v1/workloads"] = {"total": 1, "workloads": [
        {"id": "w-1", "project": "alpha/train", "user": "alice", "gpu_type": "H100", "gpus": 4, "state": "completed",
         "attempt": 1, "submitted_ms": 1796135520000, "started_ms": 1796135525000, "ended_ms": 1796139120000,
         "preemptions": 0}]}
    assert main(["workloads", "--user", "alice", "--state", "completed"]) == 0
    assert dict(seen[0].url.params) == {"user": "alice", "state": "completed", "limit": "200"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["w-1", "alpha/train", "alice", "4", "H100", "completed", "2026-12-01", "14:32:00Z",
                                "5s", "1h00m", "0"]


def test_nodes_repair_posts_to_the_gateways_route(gateway, capsys):
    answers, seen = gateway
    answers["POST", "/v1/nodes/H100-001/repair"] = {"node": "H100-001", "event_id": "node.repaired.H100-001.1"}
    assert main(["nodes", "repair", "H100-001"]) == 0
    assert [(r.method, r.url.path) for r in seen] == [("POST", "/v1/nodes/H100-001/repair")]
    assert capsys.readouterr().out == "H100-001: declared repaired (node.repaired.H100-001.1)\n"


def test_a_gateway_error_is_one_line_with_its_status(gateway, capsys):
    assert pytest.raises(SystemExit, main, ["status", "w-unknown"]).value.code == 1
    assert capsys.readouterr().err == "timeshare: 404: no canned answer for ('GET', '/v1/workloads/w-unknown')\n"


def test_budget_report_shows_a_field_the_ledger_does_not_send_as_a_dash(gateway, capsys):
    answers, _ = gateway
    answers["GET", "/v1/report"] = {"from_s": None, "to_s": 1796135520.0,
                                    "teams": {"alpha/train": {"fraction": 0.5, "attainment": 0.9}}}
    assert main(["budget", "report"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("GPU-hours owed and delivered, from the first event to 2026-12-01 14:32:00Z")
    assert out[2].split() == ["alpha/train", "0.500", "-", "-", "90.0%"]
    assert out[3:] == ["fleet attainment -, lowest team -, - of - teams at or above 95%",
                       "occupancy -, unallocated work - of busy GPUs, - preemptions"]


# -- which stack: TIMESHARE_URL, else the env file `make run` writes, else the default --

@pytest.fixture
def seen_by_client(monkeypatch):
    """Every request the CLI sends, whatever client it builds (answers 200 {} to all)."""
    seen: list[httpx.Request] = []

    class Client(httpx.Client):
        def __init__(self, **kwargs):
            super().__init__(transport=httpx.MockTransport(lambda r: (seen.append(r), httpx.Response(
                200, json={"user": "admin", "admin": True}))[1]), **kwargs)

    monkeypatch.setattr(cli.httpx, "Client", Client)
    monkeypatch.delenv("TIMESHARE_URL", raising=False)
    monkeypatch.delenv("TIMESHARE_TOKEN", raising=False)
    return seen


def test_without_timeshare_url_the_cli_talks_to_the_devstack_of_its_env_file_and_says_so(
        seen_by_client, tmp_path, monkeypatch, capsys):
    env = tmp_path / "env"
    env.write_text("# written by the devstack\nexport TIMESHARE_URL=http://127.0.0.1:41234\n"
                   "export TIMESHARE_TOKEN=dev-admin\n")
    monkeypatch.setenv("TIMESHARE_DEVSTACK_ENV", str(env))
    assert main(["whoami"]) == 0
    (request,) = seen_by_client
    assert str(request.url) == "http://127.0.0.1:41234/v1/whoami"
    assert request.headers["authorization"] == "Bearer dev-admin"
    out, err = capsys.readouterr()
    assert out == "admin (admin)\n"
    assert err == f"timeshare: the devstack at http://127.0.0.1:41234 (from {env}; TIMESHARE_URL for another)\n"
    # a token of one's own is kept
    monkeypatch.setenv("TIMESHARE_TOKEN", "dev-user")
    assert main(["whoami"]) == 0
    assert seen_by_client[-1].headers["authorization"] == "Bearer dev-user"


def test_timeshare_url_wins_over_the_env_file_and_nothing_is_said(seen_by_client, tmp_path, monkeypatch, capsys):
    env = tmp_path / "env"
    env.write_text("export TIMESHARE_URL=http://127.0.0.1:41234\nexport TIMESHARE_TOKEN=dev-admin\n")
    monkeypatch.setenv("TIMESHARE_DEVSTACK_ENV", str(env))
    monkeypatch.setenv("TIMESHARE_URL", "http://gateway.example:9000")
    assert main(["whoami"]) == 0
    assert str(seen_by_client[0].url) == "http://gateway.example:9000/v1/whoami"
    assert "authorization" not in seen_by_client[0].headers  # the file's token goes with the file's stack only
    assert capsys.readouterr().err == ""


def test_without_either_it_is_the_default_address(seen_by_client, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIMESHARE_DEVSTACK_ENV", str(tmp_path / "missing"))
    assert main(["whoami"]) == 0
    assert str(seen_by_client[0].url) == "http://127.0.0.1:8080/v1/whoami"
    assert capsys.readouterr().err == ""


def test_a_stack_that_is_gone_is_named_with_where_it_came_from(tmp_path, monkeypatch, capsys):
    from services.devstack.servers import free_port

    env = tmp_path / "env"
    env.write_text(f"export TIMESHARE_URL=http://127.0.0.1:{free_port()}\n")
    monkeypatch.setenv("TIMESHARE_DEVSTACK_ENV", str(env))
    monkeypatch.delenv("TIMESHARE_URL", raising=False)
    with pytest.raises(SystemExit) as stopped:
        main(["queue"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("timeshare: cannot reach the gateway at http://127.0.0.1:")
    assert err.splitlines()[-1].endswith(f"is `make run` still running? ({env})")


def test_workloads_filters_are_sent_and_quiet_prints_ids_only(gateway, capsys):
    answers, seen = gateway
    row = {"project": "alpha/train", "user": "alice", "gpu_type": "H100", "gpus": 4, "state": "pending", "attempt": 1,
           "submitted_ms": 1796135520000, "started_ms": 1796135525000, "ended_ms": None, "preemptions": 1}
    answers["GET", "/v1/workloads"] = {"workloads": [dict(row, id="w-1"), dict(row, id="w-2")], "total": 2}
    assert main(["workloads", "--state", "preempted", "--preempted", "-q"]) == 0
    assert dict(seen[0].url.params) == {"limit": "200", "state": "preempted", "preempted": "true"}
    assert capsys.readouterr().out == "w-1\nw-2\n"


def test_submit_quiet_prints_the_id_only(gateway, capsys):
    answers, _ = gateway
    answers["POST", "/v1/workloads"] = {"workload_id": "w-9", "cluster": "c", "state": "submitted", "replayed": False}
    assert main(["submit", "--project", "a/b", "--gpus", "1", "--work", "1h", "-q"]) == 0
    assert capsys.readouterr().out == "w-9\n"


STATES = {
    "requeued after a preemption, waiting": ({"state": "pending", "last_event": "workload.requeued"}, True),
    "preempted, not yet requeued": ({"state": "pending", "last_event": "workload.preempted"}, True),
    "ended by a preemption (not resumable)": ({"state": "preempted", "last_event": "workload.preempted"}, True),
    "waiting, never preempted": ({"state": "pending", "last_event": "workload.submitted"}, False),
    "running again after a preemption": ({"state": "running", "last_event": "workload.started"}, False),
}


@pytest.mark.parametrize("doc, preempted", STATES.values(), ids=STATES.keys())
def test_state_preempted_is_stopped_by_a_preemption_and_not_run_since(doc, preempted):
    from services.gateway.routes.workloads import state_matches

    assert state_matches(doc, "preempted") is preempted
    assert state_matches(doc, doc["state"])


@pytest.mark.parametrize("command", ["simulate", "report"])
def test_a_set_without_equals_is_one_line_exit_2_before_anything_runs(command, tmp_path, capsys):
    argv = [command, "infra/demo/cluster.toml", *([str(tmp_path)] if command == "report" else []), "--set", "duration"]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert err == "timeshare: argument --set: expected KEY=VALUE (e.g. duration=10d), got 'duration'\n"
