"""A training job in miniature: counts steps of ``--step-s`` seconds up to its declared work,
checkpoints every ``--checkpoint-every`` steps and, when it was given a notice, on SIGTERM;
resumes from its checkpoint. Each attempt records how many steps it worked, so the work redone
after a preemption (lost work) can be summed.

    timeshare submit --project tulu/rl --gpus 4 --work 60s --min-runtime 10s --resumable \\
        --checkpoint-every 10s --checkpoint-on-notice 30s -- python examples/workloads/counter.py --work-s 60

Run by the process executor it reads (services/README.md, "Preemption with notice"):

* ``TIMESHARE_CHECKPOINT_DIR``: its directory, the same for every attempt. The checkpoint is
  ``counter.json`` there ({"step": n}, replaced atomically); each attempt's record is
  ``attempt-<n>.json`` ({"attempt", "start_step", "step", "state"}, rewritten after each step).
* ``TIMESHARE_NOTICE_S``: the notice it declared (``checkpoint_on_notice_s``). With one, SIGTERM
  means "checkpoint now": it saves the step it reached and exits 0 (the executor reports the
  checkpoint and placement hands its GPUs over at once). Without one, SIGTERM means stop: it exits
  without saving, as the scheduler counts it (the work since its last periodic checkpoint is lost).
* ``TIMESHARE_UNDER_NOTICE``: ``1`` when it is started under a notice already (the executor
  restarted while its notice ran): it resumes, saves what it resumed from and exits 0 at once,
  as on SIGTERM.
* ``TIMESHARE_ATTEMPT``, ``TIMESHARE_RANK``: the attempt (names the record); only rank 0 writes.

The executor removes the checkpoint directory once the workload has ended for good (completed,
failed, cancelled): ``--record-dir`` keeps the attempts' records elsewhere, to read them after.

Steps are timed from the attempt's start (step k ends at start + k x step_s), so a step is
whole seconds of the attempt's run time, as the scheduler counts progress.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

CHECKPOINT = "counter.json"


def write_json(path: str, doc: dict) -> None:
    """Replace ``path`` atomically (a reader, or the next attempt, never sees half a file)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_step(directory: str) -> int:
    try:
        with open(os.path.join(directory, CHECKPOINT)) as fh:
            return int(json.load(fh)["step"])
    except FileNotFoundError:
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-s", type=int, required=True, help="declared work, in steps")
    p.add_argument("--step-s", type=float, default=1.0, help="seconds per step")
    p.add_argument("--checkpoint-every", type=int, default=10, metavar="K", help="periodic checkpoint every K steps")
    p.add_argument("--record-dir", default=None, metavar="DIR",
                   help="where each attempt's record goes (default: the checkpoint directory, removed at the end)")
    args = p.parse_args(argv)
    directory = os.environ.get("TIMESHARE_CHECKPOINT_DIR") or os.path.join(os.getcwd(), "counter-checkpoint")
    os.makedirs(directory, exist_ok=True)
    notice_s = float(os.environ.get("TIMESHARE_NOTICE_S") or 0)
    attempt = int(os.environ.get("TIMESHARE_ATTEMPT") or 1)
    writer = os.environ.get("TIMESHARE_RANK", "0") == "0"
    record_dir = args.record_dir or directory
    os.makedirs(record_dir, exist_ok=True)
    record_path = os.path.join(record_dir, f"attempt-{attempt}.json")

    stop = {"signal": None}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(signal="SIGTERM"))

    if notice_s > 0 and os.environ.get("TIMESHARE_UNDER_NOTICE") == "1":
        stop["signal"] = "notice at start"  # the notice ran while it was down: checkpoint now
    start_step = step = read_step(directory)
    started = time.time()

    def record(state: str) -> None:
        if writer:
            write_json(record_path, {"attempt": attempt, "start_step": start_step, "step": step, "state": state,
                                     "started_at": started, "pid": os.getpid()})

    def checkpoint() -> None:
        if writer:
            write_json(os.path.join(directory, CHECKPOINT), {"step": step, "attempt": attempt, "at": time.time()})

    record("running")
    while step < args.work_s:
        due = started + (step - start_step + 1) * args.step_s
        while stop["signal"] is None and time.time() < due:
            time.sleep(min(0.02, max(0.0, due - time.time())))
        if stop["signal"] is not None:
            break
        step += 1
        if step % args.checkpoint_every == 0 or step == args.work_s:
            checkpoint()
        record("running")
    if stop["signal"] is not None:
        if notice_s > 0:
            checkpoint()  # the notice's checkpoint: nothing of this attempt is lost
            record("checkpointed")
            return 0
        record("stopped")  # no notice: the work since the last periodic checkpoint is lost
        return 128 + signal.SIGTERM
    record("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
