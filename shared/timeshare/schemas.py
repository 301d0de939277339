"""``python -m timeshare.schemas DIR``: write the JSON Schema of every event (``make schemas``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .events import json_schema


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:] or ["schemas"])[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "events.schema.json").write_text(render())
    print(f"wrote {out / 'events.schema.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
