"""Which code wrote a pickled snapshot: a hash of the scheduling core and the writer's files.

A pickle holds objects as the classes of its day defined them; loaded by other code it may
load wrong without an error. Placement's snapshot and the ledger's checkpoint are loaded only
by the code that wrote them; other code rebuilds from the log or the journal instead.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def code_version(*files: str | Path) -> str:
    import timeshare

    h = hashlib.sha256()
    for path in sorted([*Path(timeshare.__file__).parent.rglob("*.py"), *map(Path, files)]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
