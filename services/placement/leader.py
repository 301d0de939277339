"""Placement's leadership: one active instance per cluster holds a lease in a JetStream KV
bucket; a standby waits for it to lapse.

``_run`` campaigns for the lease, leads one term (``_lead``: rebuild from the log, then the
inbox loop) until the lease is lost or the work fails, steps down and campaigns again. A mixin
of ``Placement`` (service.py), whose ``__init__`` declares the state it reads and sets.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.js.errors import KeyWrongLastSequenceError

from ..common import subjects
from ..common.bus import FenceError
from ..common.supervise import describe, is_transient
from .log import UntrustedLog

log = logging.getLogger("timeshare.placement")


class Leadership:
    async def _release_lease(self) -> None:
        try:
            kv = await self.bus.js.key_value(subjects.LEASE_BUCKET)
            await kv.delete(self._lease_key(), last=self.lease_rev)
        except Exception:  # lapses by its TTL anyway
            pass

    def _lease_key(self) -> str:
        return f"placement.{self.cluster}"

    async def _run(self) -> None:
        """Campaign for the lease, lead until something goes wrong, step down, campaign again.

        Nothing but ``stop`` ends this loop: a lost lease, a fenced append, NATS going away
        mid-append or a bug in a pass each make this instance step down (logged) and campaign
        again; the next term starts from a replay of the log."""
        wait_s = 0.1
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                kv = await self.bus.js.key_value(subjects.LEASE_BUCKET)
                await self._acquire_lease(kv)
                await self._term(kv)
            except asyncio.CancelledError:
                raise
            except FenceError as exc:
                self.last_error = describe(exc)
                log.error("placement %s lost the log (%s); stepping down", self.instance, exc)
            except UntrustedLog as exc:
                # not a crash loop: wait (without the lease) for the operator's decision
                self.last_error = str(exc)
                if self.untrusted is None or self.untrusted.seq != exc.seq:
                    log.error("placement %s: %s", self.instance, exc)
                self.untrusted = exc
                self.blocked.set()
                await self._release_lease()
                await self._wait_for_skip(exc.seq)
                continue
            except Exception as exc:  # noqa: BLE001 - step down, never die
                self.last_error = describe(exc)
                log.error("placement %s stepped down: %s; campaigning again", self.instance, describe(exc),
                          exc_info=not is_transient(exc))
            finally:
                self.leader.clear()
            if time.monotonic() - started > 30:
                wait_s = 0.1
            try:
                await asyncio.wait_for(self.stop_event.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
            wait_s = min(2.0, wait_s * 2)

    async def _term(self, kv) -> None:
        """One term as leader: ends when the lease is lost (returns) or the work fails (raises)."""
        refresher = asyncio.create_task(self._refresh_lease(kv), name="placement lease")
        work = asyncio.create_task(self._lead(), name="placement leader")
        try:
            done, _ = await asyncio.wait({refresher, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (refresher, work):
                t.cancel()
            for t in (refresher, work):
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        if work in done and not work.cancelled() and work.exception() is not None:
            raise work.exception()
        if refresher in done:
            self.terms_lost += 1
            log.error("placement %s lost its lease; campaigning again", self.instance)

    async def _lead(self) -> None:
        await self._rebuild()
        # the inbox durable acks all up to a sequence at once: what the previous leader
        # fetched but never acked would be acked unseen by this leader's first ack, so
        # everything above the ack floor is delivered again now (applied ids are skipped)
        await self.bus.rewind_to_ack_floor(subjects.INBOX_STREAM, f"placement-{self.cluster}")
        if 0 < self.settings.snapshot_every <= self.replayed:
            self._maybe_snapshot(0, force=True)  # a long replay is not repeated by the next leader
        self.leader.set()
        self.terms += 1
        log.info("placement %s leads cluster %s from log seq %d", self.instance, self.cluster, self.last_log_seq)
        await self._loop()

    async def _acquire_lease(self, kv) -> None:
        key, me = self._lease_key(), self.instance.encode()
        while not self.stop_event.is_set():
            try:
                self.lease_rev = await kv.create(key, me)
                return
            except Exception:  # held (KeyWrongLastSequenceError), or NATS away: look again
                pass
            try:
                entry = await kv.get(key)
                if entry.value == me:  # still ours from the last term (stepped down, not deposed)
                    self.lease_rev = await kv.update(key, me, last=entry.revision)
                    return
            except Exception:
                pass
            await asyncio.sleep(max(0.05, self.settings.lease_ttl_s / 10))
        raise asyncio.CancelledError

    async def _refresh_lease(self, kv) -> None:
        """Keep the lease; return once it is lost (another instance holds it, or it lapsed)."""
        while True:
            await asyncio.sleep(self.settings.lease_ttl_s / 3)
            try:
                self.lease_rev = await kv.update(self._lease_key(), self.instance.encode(), last=self.lease_rev)
            except KeyWrongLastSequenceError:
                self.leader.clear()
                return
            except Exception as exc:  # NATS briefly away: try again
                log.warning("lease refresh failed: %s", exc)
