"""The ``timeshare`` command (argparse; each subcommand lives in its own module)."""

from __future__ import annotations

import argparse
import os
import re
import sys


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``timeshare: argument --gpus: ...``, exit 2
    (subcommands' parsers are made of the same class)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # "-2h" is a (negative) duration given as a value, not an unknown option: the argument's
        # own check then names what is wrong with it (argparse itself takes only "-2", "-.5")
        self._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d[\d.]*\s*[a-zA-Z][\w .]*$")

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"timeshare: {message} (see: {self.prog} --help)\n")


def build_parser(simulator_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line; ``simulator_only``: the simulator's and the report's subcommands
    alone (``simulate`` and ``sweep`` parse their arguments without importing the importers or
    the live services' client)."""
    parser = Parser(prog="timeshare", description="GPU time budgets, fair share and a simulator")
    sub = parser.add_subparsers(dest="command", required=True)
    from .sim import cli as sim_cli

    sim_cli.add_parsers(sub)
    if simulator_only:
        from .report import cli as report_cli

        report_cli.add_parser(sub)
        return parser
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


#: subcommands that spend their time in the scheduling core: they run the compiled core when
#: `make setup` built one for these sources
_HEAVY = {"simulate", "sweep"}


def _run_compiled_if_built(argv: list[str]) -> None:
    """Re-run this command in the compiled core (``.build/mypyc/<hash>``, built by ``make setup``
    from these very sources), or say in one line that it runs in pure Python. The two decide
    identically (tests/sim/test_compiled.py); the compiled one is about three times faster.
    ``TIMESHARE_PURE=1`` keeps pure Python."""
    import importlib.util
    import os
    from pathlib import Path

    if os.environ.get("TIMESHARE_PURE") or os.environ.get("TIMESHARE_COMPILED_CORE"):
        return
    spec = importlib.util.find_spec("timeshare.scheduler")  # (found, not imported: the child imports it)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return  # already compiled
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "compiled.py"
    path = None
    if script.exists():
        spec = importlib.util.spec_from_file_location("timeshare_compiled_build", script)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
                candidate = module.build_dir()
                path = candidate if module.is_built(candidate) else None
            except Exception:  # noqa: BLE001 (no mypy, unreadable sources: pure Python it is)
                path = None
    if path is None:
        print("note: running the pure-Python core (no compiled core built for these sources; "
              "`make setup` or `make compiled` builds one, about 3x faster)", file=sys.stderr)
        return
    env = module.env(path)
    env["TIMESHARE_COMPILED_CORE"] = str(path)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "timeshare.cli", *argv], env)


def main(argv: list[str] | None = None) -> int:
    heavy = argv is None and len(sys.argv) > 1 and sys.argv[1] in _HEAVY
    if heavy:
        # only from the command line (a caller of main() in its own process keeps it), and
        # before anything is imported: the compiled core's process parses the arguments itself
        _run_compiled_if_built(sys.argv[1:])
    parser = build_parser(simulator_only=heavy)
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`timeshare queue | head -1`): stop quietly with the status of a
        # tool ended by SIGPIPE; what is still buffered goes to /dev/null at exit, not to a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE (13), as a shell reports a tool that signal ended
    return code


if __name__ == "__main__":
    sys.exit(main())
