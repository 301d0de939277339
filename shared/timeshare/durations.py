"""Durations as people write them: plain seconds, "90s", "15m", "8h", "7d", "1d12h", and the same
with unit words and spaces: "2hours", "90min", "1 day", "45 sec", "1 day 12 hours"."""

import math
import re

_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
#: every unit word accepted, by the letter it stands for (case does not matter)
_UNIT_WORDS = {
    "d": ("d", "day", "days"),
    "h": ("h", "hr", "hrs", "hour", "hours"),
    "m": ("m", "min", "mins", "minute", "minutes"),
    "s": ("s", "sec", "secs", "second", "seconds"),
}
_UNITS = {word: _UNIT_S[letter] for letter, words in _UNIT_WORDS.items() for word in words}
#: one amount and its unit, spaces allowed before the amount and between amount and unit
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)")
_HINT = "use seconds or e.g. '90s', '15m', '2h30m', '2hours', '90min', '1 day', '45 sec'"


def parse_duration_s(value: object) -> int:
    """Return whole seconds for an int/float or a string like "1d12h" or "1 day"; raise ValueError
    naming the value."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value!r}")
        return int(round(value))
    if not isinstance(value, str):
        raise ValueError(f"expected a duration, got {value!r}")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(round(float(text)))
    pos, total = 0, 0.0
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None:
            break
        seconds = _UNITS.get(match.group(2))
        if seconds is None:
            known = ", ".join("/".join(words) for words in _UNIT_WORDS.values())
            raise ValueError(f"not a duration: {value!r} ({match.group(2)!r} is not a unit; units are {known})")
        total += float(match.group(1)) * seconds
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {value!r} ({_HINT})")
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
