"""Names for the numbers of the core, for annotations (and for mypyc, which compiles them).

Times and durations in seconds are ``int`` while they are whole (trace submissions, minimum
runtimes) and ``float`` once a fraction of a second enters (``at_ms / 1000``). They must stay
what they are: an ``int`` turned into a ``float`` would change what events and sort keys
carry. So they are annotated ``Seconds`` (``int | float``), never ``float``: mypyc converts
an ``int`` given to a ``float`` annotation into a ``float``, and keeps a ``Seconds`` as it is.
"""

from __future__ import annotations

from typing import Union

#: a time or a duration in seconds, int or float as it came (see the module doc)
Seconds = Union[int, float]


def ms_to_s(ms: int) -> Seconds:
    """Event time (integer milliseconds) to seconds: whole seconds stay ``int`` (see above), so
    the simulator and the live services, which both read event times, decide alike."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def s_to_ms(s: Seconds) -> int:
    """Seconds to the integer milliseconds events carry."""
    return int(round(s * 1000))
