"""The ``timeshare`` command (argparse; each subcommand lives in its own module)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timeshare", description="GPU time budgets, fair share and a simulator")
    sub = parser.add_subparsers(dest="command", required=True)
    from .sim import cli as sim_cli

    sim_cli.add_parsers(sub)
    schemas = sub.add_parser("schemas", help="write the JSON Schema of every event (make schemas)")
    schemas.add_argument("dir", nargs="?", default="schemas")
    schemas.set_defaults(func=write_schemas)
    for module in ("timeshare.importers.cli", "timeshare.report.cli", "services.cli"):
        try:
            mod = __import__(module, fromlist=["add_parser"])
        except ImportError:
            continue  # optional part not installed
        add = getattr(mod, "add_parsers", None) or getattr(mod, "add_parser")
        add(sub)
    return parser


def write_schemas(args) -> int:
    import json
    from pathlib import Path

    from .events import json_schema

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "events.schema.json").write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {out / 'events.schema.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
