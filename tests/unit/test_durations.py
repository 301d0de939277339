"""Durations as people write them: plain seconds or "90s", "15m", "8h", "7d", "1d12h"."""

from __future__ import annotations

import pytest

from timeshare.durations import format_duration_s, parse_duration_s


@pytest.mark.parametrize("text, seconds", [
    (90, 90), (2.4, 2), ("45", 45), ("90s", 90), ("15m", 900), ("8h", 28800), ("7d", 604800),
    ("1d12h", 129600), ("1h30m15s", 5415), ("1.5h", 5400), (" 2H ", 7200), (0, 0),
], ids=["an int is seconds", "a float rounds to whole seconds", "digits in a string are seconds",
        "seconds", "minutes", "hours", "days", "days and hours", "three units", "a decimal amount",
        "case and surrounding spaces do not matter", "zero"])
def test_parses(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("bad", ["", "h", "8x", "1h 30m", "-5", "5m3", True, None, [1], -1],
                         ids=["empty", "a unit without a number", "an unknown unit", "spaces inside",
                              "a negative string", "a trailing number without unit", "a boolean", "None",
                              "a list", "a negative number"])
def test_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration_s(bad)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (45, "45s"), (720, "12m"), (725, "12m05s"), (3 * 3600 + 300, "3h05m"), (2 * 86400 + 4 * 3600, "2d04h"),
])
def test_formats_short(seconds, text):
    assert format_duration_s(seconds) == text
