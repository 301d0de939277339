"""Durations as people write them: plain seconds, "90s", "15m", "8h", "7d", "1d12h", and unit
words with or without spaces: "2hours", "90min", "1 day", "45 sec"."""

from __future__ import annotations

import pytest

from timeshare.durations import format_duration_s, parse_duration_s

PARSES = {
    "an int is seconds": (90, 90),
    "a float rounds to whole seconds": (2.4, 2),
    "digits in a string are seconds": ("45", 45),
    "seconds": ("90s", 90),
    "minutes": ("15m", 900),
    "hours": ("8h", 28800),
    "days": ("7d", 604800),
    "days and hours": ("1d12h", 129600),
    "three units": ("1h30m15s", 5415),
    "a decimal amount": ("1.5h", 5400),
    "case and surrounding spaces do not matter": (" 2H ", 7200),
    "zero": (0, 0),
    "hours and minutes": ("2h30m", 9000),
    "a unit word in the plural": ("2hours", 7200),
    "a unit word in the singular": ("1hour", 3600),
    "an abbreviated unit word": ("90min", 5400),
    "a space between amount and unit word": ("1 day", 86400),
    "seconds abbreviated with a space": ("45 sec", 45),
    "hours as hr": ("3hr", 10800),
    "minutes spelled out": ("5 minutes", 300),
    "seconds spelled out": ("1 second", 1),
    "unit words in capitals": ("2 HOURS", 7200),
    "two parts with unit words and spaces": ("1 day 12 hours", 129600),
    "two parts with short units and a space between them": ("1h 30m", 5400),
    "a decimal amount with a unit word": ("1.5 days", 129600),
}


@pytest.mark.parametrize("text, seconds", PARSES.values(), ids=PARSES.keys())
def test_parses(text, seconds):
    assert parse_duration_s(text) == seconds


REJECTS = {
    "empty": "",
    "only spaces": "   ",
    "a unit without a number": "h",
    "an unknown unit": "8x",
    "an unknown unit word": "2 fortnights",
    "a unit word misspelled": "2 hourz",
    "a word that is not a duration": "lots",
    "a negative string": "-5",
    "a trailing number without unit": "5m3",
    "a trailing number without unit after a space": "1h 30",
    "a unit word twice": "1 day days",
    "an exponent is not a unit": "1e5",
    "a nan string": "nan",
    "an inf string": "inf",
    "a boolean": True,
    "None": None,
    "a list": [1],
    "a negative number": -1,
    "a float nan": float("nan"),
    "a float infinity": float("inf"),
}


@pytest.mark.parametrize("bad", REJECTS.values(), ids=REJECTS.keys())
def test_rejects_with_a_value_error_naming_the_value(bad):
    with pytest.raises(ValueError) as caught:
        parse_duration_s(bad)
    assert repr(bad) in str(caught.value)


def test_an_unknown_unit_word_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"'fortnights' is not a unit; units are d/day/days, h/hr/hrs/hour/hours"):
        parse_duration_s("2 fortnights")


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (45, "45s"), (720, "12m"), (725, "12m05s"), (3 * 3600 + 300, "3h05m"), (2 * 86400 + 4 * 3600, "2d04h"),
])
def test_formats_short(seconds, text):
    assert format_duration_s(seconds) == text
