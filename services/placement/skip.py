"""An operator's explicit decision: placement skips one log record it cannot apply.

    python -m services.placement.skip --seq 1234 --reason "forged start, double-books H100-001"

Placement refuses to lead from a log record it cannot apply (a forged start that double-books
a GPU, a completion of an unknown workload...): it reports the record's sequence and why
(logs, ``/healthz``) and waits. This command adds the sequence to the KV entry
``timeshare_operator/skip.<cluster>``; placement sees it within a second, replays the log
without that record and leads. Only the ``operator`` NATS user may write that bucket. The
record stays in the log (the audit trail); ``--list`` prints what was skipped and why.
Settings come from ``TIMESHARE_*`` (NATS URL, credentials, cluster file / name).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import msgspec

from ..common import subjects
from ..common.bus import Bus
from ..common.cluster_config import load_cluster
from ..common.settings import Settings


async def skip(settings: Settings, cluster: str, seq: int | None, reason: str, by: str) -> dict:
    """Add ``seq`` to the cluster's skip list (None: only read it); returns the whole list."""
    bus = await Bus.connect(settings, cluster, name="operator-skip", role="operator")
    try:
        await bus.ensure_infra()
        kv = await bus.js.key_value(subjects.OPERATOR_BUCKET)
        key = f"skip.{cluster}"
        for _ in range(5):  # compare-and-set: two operators never overwrite each other
            try:
                entry = await kv.get(key)
                table, revision = msgspec.json.decode(entry.value), entry.revision
            except Exception:
                table, revision = {}, None
            if seq is None:
                return table
            table[str(seq)] = {"reason": reason, "by": by, "at_ms": int(time.time() * 1000)}
            try:
                if revision is None:
                    await kv.create(key, msgspec.json.encode(table))
                else:
                    await kv.update(key, msgspec.json.encode(table), last=revision)
                return table
            except Exception:
                await asyncio.sleep(0.1)
        raise RuntimeError("the skip list kept changing under us; try again")
    finally:
        await bus.close()


def main(argv: list[str] | None = None) -> int:
    import getpass

    p = argparse.ArgumentParser(prog="python -m services.placement.skip", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, help="the log record's stream sequence (placement names it)")
    p.add_argument("--reason", default="", help="why (kept with the decision)")
    p.add_argument("--list", action="store_true", help="print the records skipped so far")
    args = p.parse_args(argv)
    if not args.list and (args.seq is None or args.seq < 1 or not args.reason.strip()):
        p.error("give --seq N (at least 1) and --reason, or --list")
    settings = Settings.from_env()
    cluster = settings.cluster or load_cluster(settings.cluster_file).name
    table = asyncio.run(skip(settings, cluster, None if args.list else args.seq, args.reason, getpass.getuser()))
    for s, d in sorted(table.items(), key=lambda kv: int(kv[0])):
        print(f"seq {s}: skipped by {d.get('by')}: {d.get('reason')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
