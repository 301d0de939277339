"""``python -m services.admin setup [--cluster NAME ...]``: the operator's setup step (setup.py).

Settings come from the environment as for every service (TIMESHARE_NATS_URL,
TIMESHARE_NATS_CREDENTIALS with the operator's password, TIMESHARE_CLUSTER or the cluster
file's name)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ..common.cluster_config import load_cluster
from ..common.settings import Settings
from .setup import setup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.admin")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup", help="create the streams, durable consumers, KV buckets and object stores "
                                     "of infra/nats.json (as the operator's NATS user)")
    p.add_argument("--cluster", action="append", default=[],
                   help="cluster name (repeatable); default: TIMESHARE_CLUSTER or the cluster file's name")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    clusters = args.cluster or [load_cluster(settings.cluster_file, settings.cluster).name]
    try:
        for line in asyncio.run(setup(settings, clusters)):
            print(line)
    except Exception as exc:
        print(f"setup failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
