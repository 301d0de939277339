"""Bring your own trace: turn other clusters' logs into timeshare's trace format (JSON Lines).

Each importer returns ``ImportResult(records, report)``: the trace records as dicts in the
trace's key order (submit times rebased so the earliest is 0, ordered by submit time) and an
``ImportReport`` of kept and dropped rows with the reason for each drop. The contract fields
the sources lack are filled by ``Rules`` (see ``common``); each module's docstring documents
its field mapping. ``cli.add_parser`` adds the ``timeshare import`` subcommand.
"""

from .alibaba import import_openb, import_pai
from .common import ImportReport, ImportResult, MinRuntimeRule, RowError, Rules, check_record, write_jsonl
from .events_log import import_events
from .gavel import import_gavel
from .helios import import_helios

__all__ = [
    "ImportReport", "ImportResult", "MinRuntimeRule", "RowError", "Rules", "check_record", "write_jsonl",
    "import_events", "import_gavel", "import_helios", "import_openb", "import_pai",
]
