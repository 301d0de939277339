"""Proposing a write so that the HTTP answer is true (issue 22, finding 2).

During a NATS outage nats-py kept publishes in its buffer and sent them after the reconnect:
62 submissions answered ``503 nats: timeout`` and 61 of them ran. Now:

* the gateway's connection buffers nothing while disconnected (``pending_size=0``: nats-py
  refuses the publish at once), so a publish refused that way never left: ``NotPublished``,
  answered 503, and a retry is safe;
* a publish that left but got no JetStream ack (the connection dropped with it in flight, the
  server is slow) is sent again with the same ``Nats-Msg-Id`` until one ack comes (JetStream
  answers a duplicate with the same stream position) or ``confirm_s`` passes: then the
  answer is "unconfirmed" with the id to ask about, never 503.
"""

from __future__ import annotations

import asyncio
import time

import nats

from timeshare import events as ev

#: how long one request keeps trying to confirm a publish that may have left
CONFIRM_S = 8.0


class NotPublished(Exception):
    """The event never left this process: it is not in the inbox, nothing was done."""


_NEVER_LEFT = (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionClosedError,
               nats.errors.ConnectionDrainingError, nats.errors.ConnectionReconnectingError,
               nats.errors.NoRespondersError)


async def propose_confirmed(bus, event: ev.Event, confirm_s: float = CONFIRM_S) -> bool:
    """Put ``event`` in placement's inbox. True: JetStream acked it (it is there). False: it may
    be there (sent, no ack within ``confirm_s``). Raises ``NotPublished`` when it is known not
    to be there (never sent; or the server answered that no stream takes it)."""
    deadline = time.monotonic() + confirm_s
    sent = False
    while True:
        if bus.nc.is_connected:
            try:
                await bus.propose(event)
                return True
            except _NEVER_LEFT as exc:
                # no responders: the server itself said no stream stored it
                if not sent:
                    raise NotPublished(f"{type(exc).__name__}: {exc}") from None
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                sent = True  # it may have reached the stream; only an ack says so
            except RuntimeError as exc:  # JetStream answered with an error: not stored
                if not sent:
                    raise NotPublished(str(exc)) from None
        elif not sent:
            raise NotPublished("NATS is not connected (reconnecting)")
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)
