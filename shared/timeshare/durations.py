"""Durations as people write them: plain seconds or "90s", "15m", "8h", "7d", "1d12h"."""

import re

_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration_s(value: object) -> int:
    """Return whole seconds for an int/float or a string like "1d12h"; raise ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value!r}")
        return int(round(value))
    if not isinstance(value, str):
        raise ValueError(f"expected a duration, got {value!r}")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(round(float(text)))
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '90s', '15m', '8h', '7d', '1d12h')")
    return int(round(total))


def format_duration_s(seconds: float) -> str:
    """Short human form: 0s, 45s, 12m, 3h05m, 2d04h."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
