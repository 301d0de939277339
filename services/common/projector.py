"""One runner for every projection of the log (gateway, budget, ledger, health).

A projection only says how an event changes its state (``fold``, no I/O) and what the store
must hold for that; the runner owns everything around it:

1. fetch a batch from the projection's durable pull consumer (re-subscribing, and recreating
   the durable from ``infra/nats.json`` if NATS lost it, whenever fetching fails: a NATS
   restart heals by itself);
2. skip what the store already holds (sequence <= the recorded one: a redelivery);
3. decode (strict msgspec); an undecodable message goes to the dead-letter stream;
4. ``begin`` (read what the batch needs from the store) -> ``fold`` each event -> commit the
   changes *and* the batch's last stream sequence in one transaction -> ``committed`` (the
   projection adopts its new in-memory state, wakes waiters);
5. ack the batch (AckAll on the last message).

A lost connection (NATS or PostgreSQL) is retried with capped exponential backoff (tenacity)
until it comes back: nothing is acked meanwhile, so nothing is lost. A batch the store refuses
for its *data* (a NUL character in a text field, an index row too large, a fold that raises)
is retried one event at a time, and the one event that still fails goes to the dead-letter
stream with the reason while its sequence is recorded, so the projection moves on instead of
stalling. ``status`` (lag, last error, dead letters) feeds ``/healthz``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import msgspec
import nats.errors
from nats.js.errors import NotFoundError
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from timeshare import events as ev

from . import subjects
from .store import Changes, StoreBehind
from .supervise import describe, is_transient, spawn

log = logging.getLogger("timeshare.projector")


class Projection(Protocol):
    """What one projection defines; see ``Projector`` for everything else."""

    #: the durable consumer's name, also the key of the stored stream sequence
    consumer: str

    async def load(self, store) -> None:
        """(Re)load the in-memory state from the store (at start, and when the store went back)."""

    async def begin(self, store, events: list[tuple[int, ev.Event]]) -> Any:
        """A working copy of the state for one batch (may read the documents it touches)."""

    def fold(self, work: Any, seq: int, event: ev.Event, changes: Changes) -> Any:
        """Apply one event to the working copy and record what the store must hold; no I/O."""

    def committed(self, work: Any, events: list[tuple[int, ev.Event]]) -> None:
        """The batch is stored: adopt the working copy (and wake whoever waits for it)."""


@dataclass
class ConsumerStatus:
    consumer: str
    stream: str
    #: the last stream sequence stored (applied) by this projection
    applied_seq: int = 0
    #: messages on the consumer not yet applied (from the last fetch or consumer info)
    lag: int | None = None
    #: "starting", "running", "retrying" (a connection is lost) or "stopped"
    state: str = "starting"
    last_error: str | None = None
    errors: int = 0
    dead_letters: int = 0
    #: times the consumer was re-positioned after NATS reconnected
    resubscribed: int = 0
    #: times the store was found behind what it had confirmed, and the stream read again
    rewound: int = 0
    retrying_since: float | None = None
    last_progress: float = 0.0

    def stuck(self, stuck_after_s: float, now: float | None = None) -> bool:
        """Retrying for too long, or messages waiting and nothing applied for too long."""
        now = time.monotonic() if now is None else now
        if self.retrying_since is not None and now - self.retrying_since > stuck_after_s:
            return True
        return bool(self.lag) and now - self.last_progress > stuck_after_s

    def as_dict(self, stuck_after_s: float) -> dict:
        d = asdict(self)
        now = time.monotonic()
        d["retrying_for_s"] = round(now - self.retrying_since, 3) if self.retrying_since is not None else None
        d["since_progress_s"] = round(now - self.last_progress, 3) if self.last_progress else None
        del d["retrying_since"], d["last_progress"]
        d["stuck"] = self.stuck(stuck_after_s, now)
        return d


class Projector:
    def __init__(self, projection: Projection, bus, store, stop: asyncio.Event, *,
                 stream: str = subjects.LOG_STREAM, batch: int = 500, idle_timeout_s: float = 0.25,
                 stuck_after_s: float = 30.0, max_backoff_s: float = 2.0, info_every_s: float = 2.0):
        self.projection = projection
        self.bus = bus
        self.store = store
        self.stop = stop
        self.stream = stream
        self.batch = batch
        self.idle_timeout_s = idle_timeout_s
        self.stuck_after_s = stuck_after_s
        self.max_backoff_s = max_backoff_s
        self.info_every_s = info_every_s
        self.consumer = projection.consumer
        self.status = ConsumerStatus(self.consumer, stream)
        self.task: asyncio.Task | None = None

    @property
    def applied_seq(self) -> int:
        return self.status.applied_seq

    async def start(self) -> "Projector":
        self.status.applied_seq = await self.store.last_seq(self.consumer)
        self.status.last_progress = time.monotonic()
        self.task = spawn(f"projector {self.consumer}", self._run, self.stop, max_wait_s=self.max_backoff_s,
                          on_error=self._note_error)
        return self

    async def close(self, timeout_s: float = 3.0) -> None:
        self.stop.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(self.task, timeout_s)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                self.task.cancel()
        self.status.state = "stopped"

    # -- status ---------------------------------------------------------------------------
    def healthy(self) -> bool:
        return not self.status.stuck(self.stuck_after_s)

    def report(self) -> dict:
        return self.status.as_dict(self.stuck_after_s)

    def _note_error(self, exc: BaseException) -> None:
        self.status.errors += 1
        self.status.last_error = describe(exc)
        if self.status.retrying_since is None:
            self.status.retrying_since = time.monotonic()
        self.status.state = "retrying"

    def _note_progress(self) -> None:
        self.status.state = "running"
        self.status.retrying_since = None
        self.status.last_progress = time.monotonic()

    # -- the loop -------------------------------------------------------------------------
    async def _subscribe(self, rewind: bool = False):
        """Bind to the durable; first make it deliver again everything after the stored
        sequence when ``rewind`` is asked or the durable delivered past the store: a batch a
        killed process fetched but never stored is otherwise redelivered only after ack_wait,
        and by then this process's first AckAll has acked it unseen."""
        try:
            info = await self.bus.js.consumer_info(self.stream, self.consumer)
            delivered = info.delivered.stream_seq if info.delivered else 0
            rewind = rewind or delivered > self.status.applied_seq
            await self.bus._align_durable(self.stream, self.consumer, self.status.applied_seq, force=rewind)
        except NotFoundError:
            # the durable is gone (NATS lost its store): create it again from infra/nats.json;
            # the store's sequence says what to skip
            log.warning("durable %s on %s is missing: creating it again", self.consumer, self.stream)
            await self.bus.ensure_infra()
            await self.bus._align_durable(self.stream, self.consumer, self.status.applied_seq, force=rewind)
        return await self.bus.js.pull_subscribe_bind(self.consumer, self.stream)

    async def _run(self) -> None:
        # after a failure the connection may have dropped with a delivery in flight: rewind
        sub = await self._subscribe(rewind=self.status.errors > 0)
        epoch = self.bus.reconnects
        if self.status.state != "retrying":
            self.status.state = "running"
        last_info = time.monotonic()
        try:
            while not self.stop.is_set():
                try:
                    msgs = await sub.fetch(self.batch, timeout=self.idle_timeout_s)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    msgs = []
                if self.bus.reconnects != epoch:
                    # a delivery in flight when the connection dropped is lost, and acking
                    # "all up to" a later message would ack it unseen: not this batch, but
                    # everything after the stored sequence, again
                    log.warning("%s: NATS reconnected; redelivering from seq %d", self.consumer,
                                self.status.applied_seq + 1)
                    await sub.unsubscribe()
                    sub = await self._subscribe(rewind=True)
                    epoch = self.bus.reconnects
                    self.status.resubscribed += 1
                    continue
                if not msgs:
                    if time.monotonic() - last_info >= self.info_every_s:
                        # also proves the consumer still exists (NotFoundError -> re-subscribe)
                        info = await sub.consumer_info()
                        self.status.lag = info.num_pending
                        last_info = time.monotonic()
                        if self.status.state == "retrying":
                            self._note_progress()
                    continue
                try:
                    await self.handle(msgs)
                except StoreBehind as exc:
                    # the store lost commits it had confirmed (a PostgreSQL crash with
                    # synchronous_commit=off...): reload from it and read again from its sequence
                    log.error("%s; reloading and reading the stream again from seq %d", exc, exc.stored_seq + 1)
                    await sub.unsubscribe()
                    self.status.applied_seq = exc.stored_seq
                    await self.projection.load(self.store)
                    sub = await self._subscribe(rewind=True)
                    epoch = self.bus.reconnects
                    self.status.rewound += 1
                    continue
                await msgs[-1].ack()  # AckAll: acks the whole batch
                self.status.lag = msgs[-1].metadata.num_pending
                self._note_progress()
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def handle(self, msgs) -> None:
        """Store a fetched batch (skipping what is stored, dead-lettering what cannot be); no ack."""
        items: list[tuple[int, object, ev.Event | None, str | None]] = []
        for m in msgs:
            seq = m.metadata.sequence.stream
            if seq <= self.status.applied_seq:
                continue  # redelivered: already stored
            try:
                items.append((seq, m, ev.decoder.decode(m.data), None))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                items.append((seq, m, None, f"undecodable event: {exc}"))
        if not items:
            return
        async for attempt in AsyncRetrying(retry=retry_if_exception(is_transient),
                                           wait=wait_exponential_jitter(multiplier=0.05, max=self.max_backoff_s, jitter=0.05),
                                           stop=lambda _state: self.stop.is_set(),
                                           before_sleep=lambda rs: self._note_error(rs.outcome.exception()),
                                           reraise=True):
            with attempt:
                await self._store(items)

    async def _store(self, items) -> None:
        for seq, m, e, reason in items:
            if e is None and seq > self.status.applied_seq:
                await self._dead_letter(m, reason)
        good = [(seq, m, e) for seq, m, e, _ in items if e is not None and seq > self.status.applied_seq]
        last = items[-1][0]
        try:
            await self._commit([(seq, e) for seq, _, e in good], last)
        except Exception as exc:
            if is_transient(exc) or isinstance(exc, StoreBehind):
                raise
            if len(good) > 1:
                log.warning("%s: a batch of %d events could not be stored (%s); storing them one at a time",
                            self.consumer, len(good), describe(exc))
                for seq, m, e in good:
                    await self._store([(seq, m, e, None)])
                if last > self.status.applied_seq:
                    await self._commit([], last)
                return
            if not good:
                raise
            # one event refused: for its data, or because the store cannot store anything (its
            # schema gone...)? A read of the stored sequence tells; only a record the working
            # store refuses is dead-lettered (with the reason), and its sequence recorded
            await self.store.last_seq(self.consumer)
            seq, m, e = good[0]
            await self._dead_letter(m, f"cannot store {ev.event_type(e)} {e.event_id}: {describe(exc)}")
            await self._commit([], last)

    async def _commit(self, events: list[tuple[int, ev.Event]], last: int) -> None:
        work = await self.projection.begin(self.store, events) if events else None
        changes = Changes()
        for seq, e in events:
            work = self.projection.fold(work, seq, e, changes)
        if await self.store.commit(self.consumer, last, changes, expect_at_least=self.status.applied_seq) and events:
            self.projection.committed(work, events)
        self.status.applied_seq = max(self.status.applied_seq, last)

    async def _dead_letter(self, msg, reason: str) -> None:
        await self.bus.dead_letter(self.consumer, msg, reason)
        self.status.dead_letters += 1
