"""The event bus: JetStream streams/consumers from infra/nats.json, publishing, consuming.

Publishing sets ``Nats-Msg-Id`` to the event id (JetStream drops a duplicate inside the
duplicate window) and puts the trace context in the headers. Placement appends a batch to the
log with its first event carrying ``Nats-Expected-Last-Subject-Sequence`` over the cluster's
log subjects, confirmed before the rest of the batch is pipelined: a deposed leader (or one
rebuilt from part of the log) has its whole batch refused (fencing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Awaitable, Callable, Iterable

import msgspec
import nats
from nats.js import api
from nats.js.errors import APIError, BadRequestError, NotFoundError

from timeshare import events as ev

from . import nats_auth, subjects
from .settings import ROOT, Settings
from .telemetry import inject_context

log = logging.getLogger("timeshare.bus")

INFRA_FILE = ROOT / "infra" / "nats.json"


#: how long a publish or a JetStream API request (consumer info, create, delete) waits for an
#: answer. A stream or consumer whose leader died answers nothing until a new leader is elected
#: (seconds, on a cluster): the caller retries sooner (a publish with the same Nats-Msg-Id is
#: deduplicated; placement steps down and rebuilds from the log) instead of waiting 10 s
#: (measured: scheduling stopped 15 s when the log's leader was SIGKILLed on a 3-node cluster)
PUBLISH_TIMEOUT_S = 4.0


class InfraMissing(RuntimeError):
    """A stream, durable or bucket of infra/nats.json does not exist and this connection's NATS
    user may not create it: the operator's setup step has not run (yet). Retried at start."""

    transient = True


class FenceError(RuntimeError):
    """Another writer appended to the cluster's log: this instance is no longer the leader."""


def infra_definitions(settings: Settings, cluster: str) -> dict:
    values = {"cluster": cluster, "replicas": settings.replicas, "duplicate_window_s": settings.duplicate_window_s,
              "lease_ttl_s": settings.lease_ttl_s}

    def fill(v):
        if isinstance(v, str) and v.startswith("{") and v.endswith("}") and v[1:-1] in values:
            return values[v[1:-1]]
        if isinstance(v, str):
            return v.format(**values) if "{" in v else v
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        return v

    return fill(json.loads(Path(INFRA_FILE).read_text()))


def nats_tls(settings: Settings):
    """The TLS context for NATS (``TIMESHARE_NATS_TLS_CA`` / ``_CERT`` / ``_KEY``), or None."""
    if not (settings.nats_tls_ca or settings.nats_tls_cert):
        return None
    import ssl

    tls = ssl.create_default_context(cafile=settings.nats_tls_ca or None)
    if settings.nats_tls_cert:
        tls.load_cert_chain(settings.nats_tls_cert, settings.nats_tls_key or None)
    return tls


def connect_auth(settings: Settings, name: str, role: str | None = None) -> dict:
    """``nats.connect`` keyword arguments for a connection named ``name``: the NATS user of
    ``role`` (default: the service ``name`` starts with, else the operator) and its password
    when ``settings`` carry NATS credentials, and TLS when configured. Every connection of a
    service (its ``Bus`` and its faststream broker, ``broker.make_broker``) uses these."""
    creds = settings.nats_credential_table()
    user = role or nats_auth.role_of(name)
    auth: dict = {"user": user, "password": creds[user]} if user in creds else {}
    tls = nats_tls(settings)
    if tls is not None:
        auth["tls"] = tls
    return auth


class Bus:
    def __init__(self, nc, settings: Settings, cluster: str):
        self.nc = nc
        #: how many times the connection came back: a pull request in flight when it dropped
        #: may have been delivered and lost, and an AckAll past it would ack it unseen, so
        #: every consumer re-positions itself when this changes (see Projector, follow, placement)
        self.reconnects = 0
        self.js = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        self.settings = settings
        self.cluster = cluster
        #: the NATS user this connection authenticated as (None: no credentials)
        self.role: str | None = None

    @classmethod
    async def connect(cls, settings: Settings, cluster: str, name: str = "timeshare", role: str | None = None,
                      buffer_while_disconnected: bool = True) -> "Bus":
        """Connect as the NATS user of ``role`` (default: the service ``name`` starts with, else
        the operator) when ``settings`` carry NATS credentials (services/common/nats_auth.py).
        ``buffer_while_disconnected=False``: a publish while the connection is down fails at
        once instead of waiting in nats-py's buffer to be sent after the reconnect (the
        gateway: its answer must say whether a write was done; gateway/publish.py)."""
        holder: dict = {}
        auth = connect_auth(settings, name, role)
        user = auth.get("user")

        async def reconnected() -> None:
            bus = holder.get("bus")
            if bus is not None:
                bus.reconnects += 1
            log.warning("%s: reconnected to NATS (%s)", name, nc.connected_url.netloc if nc.connected_url else "?")

        async def disconnected() -> None:
            log.warning("%s: disconnected from NATS", name)

        async def error(exc: Exception) -> None:  # one line, not nats-py's traceback per attempt
            log.debug("%s: NATS connection: %s", name, exc)

        nc = await nats.connect(settings.nats_url.split(","), name=name, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.5, reconnected_cb=reconnected,
                                disconnected_cb=disconnected, error_cb=error,
                                **({} if buffer_while_disconnected else {"pending_size": 0}), **auth)
        holder["bus"] = bus = cls(nc, settings, cluster)
        bus.role = user
        return bus

    async def close(self) -> None:
        try:
            await self.nc.drain()
        except Exception:  # already closed
            pass

    # -- infra ------------------------------------------------------------------------------
    async def ensure_infra(self) -> None:
        """The operator's connection (or one without NATS users) creates or updates the streams,
        durable consumers, KV buckets and object stores of infra/nats.json; a service's only
        checks that they exist and waits (``InfraMissing`` is transient) until the operator's
        step (``python -m services.admin setup``) made them: a service's NATS user may not
        create a stream (finding 1 of issue 22: a stream on the query subjects answered every
        query). Safe to run again, so tried again through a NATS that is away or electing
        leaders (``retry_transient``)."""
        from .supervise import retry_transient

        if self.role in (None, nats_auth.OPERATOR):
            await retry_transient("creating the JetStream streams, consumers and buckets", self.create_infra)
        else:
            await retry_transient("finding the JetStream streams, consumers and buckets", self.check_infra)

    async def check_infra(self) -> None:
        """Every stream, this cluster's durables and every bucket exist (InfraMissing if not)."""
        defs = infra_definitions(self.settings, self.cluster)
        missing = []
        for s in defs["streams"]:
            try:
                await self.js.stream_info(s["name"])
            except NotFoundError:
                missing.append(f"stream {s['name']}")
        for c in defs["consumers"]:
            try:
                await self.js.consumer_info(c["stream"], c["durable_name"])
            except NotFoundError:
                missing.append(f"durable {c['durable_name']} on {c['stream']}")
        for bucket in [kv["bucket"] for kv in defs["key_value"]] + [o["bucket"] for o in defs.get("object_store", [])]:
            prefix = "KV" if any(kv["bucket"] == bucket for kv in defs["key_value"]) else "OBJ"
            try:
                await self.js.stream_info(f"{prefix}_{bucket}")
            except NotFoundError:
                missing.append(f"bucket {bucket}")
        if missing:
            raise InfraMissing(f"{', '.join(missing)} missing for cluster {self.cluster}: an operator creates "
                               f"them with `python -m services.admin setup` (infra/nats.json)")

    async def create_infra(self) -> None:
        """Create (or update) everything in infra/nats.json for this cluster (the operator's step)."""
        defs = infra_definitions(self.settings, self.cluster)
        for s in defs["streams"]:
            cfg = api.StreamConfig(
                name=s["name"], subjects=s["subjects"], description=s.get("description"),
                storage=api.StorageType(s["storage"]), retention=api.RetentionPolicy(s["retention"]),
                num_replicas=int(s["num_replicas"]), duplicate_window=float(s.get("duplicate_window", 120)),
                max_age=float(s.get("max_age", 0)) or None)
            try:
                await self.js.add_stream(cfg)
            except BadRequestError:
                await self.js.update_stream(cfg)
        for c in defs["consumers"]:
            try:
                await self.js.add_consumer(c["stream"], api.ConsumerConfig(
                    name=c["durable_name"], durable_name=c["durable_name"], filter_subject=c["filter_subject"],
                    ack_policy=api.AckPolicy(c["ack_policy"]), ack_wait=float(c["ack_wait"]),
                    max_ack_pending=int(c["max_ack_pending"]), deliver_policy=api.DeliverPolicy(c["deliver_policy"])))
            except APIError as exc:
                # a durable that exists with another start position (moved back by
                # _align_durable after an in-memory store restarted) keeps its position
                try:
                    info = await self.js.consumer_info(c["stream"], c["durable_name"])
                except NotFoundError:
                    raise exc from None
                if info.config.ack_policy != api.AckPolicy(c["ack_policy"]):
                    # an older definition (the inbox was AckAll): same position, new ack policy
                    cfg = info.config
                    cfg.ack_policy = api.AckPolicy(c["ack_policy"])
                    cfg.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
                    cfg.opt_start_seq = (info.ack_floor.stream_seq if info.ack_floor else 0) + 1
                    await self.js.delete_consumer(c["stream"], c["durable_name"])
                    await self.js.add_consumer(c["stream"], cfg)
                    log.warning("durable %s on %s now acks %s", c["durable_name"], c["stream"], c["ack_policy"])
                    continue
                log.debug("durable %s on %s kept as it is (%s)", c["durable_name"], c["stream"], exc.description)
        for kv in defs["key_value"]:
            try:
                await self.js.key_value(kv["bucket"])
            except (NotFoundError, Exception):
                ttl = float(kv["ttl"]) if kv.get("ttl") is not None else None
                await self.js.create_key_value(api.KeyValueConfig(
                    bucket=kv["bucket"], history=int(kv["history"]), ttl=ttl, description=kv.get("description"),
                    storage=api.StorageType(kv["storage"]), replicas=int(kv["replicas"])))
        for obj in defs.get("object_store", []):
            await self._object_store(obj["bucket"], create=True)

    async def object_store(self, bucket: str):
        """The object store ``bucket``; created (with the stream replicas) when missing by the
        operator's connection only (a service waits for the operator's setup: InfraMissing)."""
        return await self._object_store(bucket, create=self.role in (None, nats_auth.OPERATOR))

    async def _object_store(self, bucket: str, create: bool):
        from nats.js.errors import BucketNotFoundError

        try:
            return await self.js.object_store(bucket)
        except (BucketNotFoundError, NotFoundError):
            if not create:
                raise InfraMissing(f"object store {bucket} missing: an operator creates it with "
                                   "`python -m services.admin setup`") from None
            return await self.js.create_object_store(
                bucket, config=api.ObjectStoreConfig(bucket=bucket, replicas=self.settings.replicas,
                                                     storage=api.StorageType.FILE))

    # -- publishing -------------------------------------------------------------------------
    async def _request(self, subject: str, payload: bytes, headers: dict) -> api.PubAck:
        msg = await self.nc.request(subject, payload, timeout=PUBLISH_TIMEOUT_S, headers=headers)
        resp = json.loads(msg.data)
        if "error" in resp:
            err = resp["error"]
            if err.get("err_code") == 10071:  # wrong last sequence
                raise FenceError(f"{subject}: {err.get('description')}")
            raise RuntimeError(f"publish to {subject} failed: {err}")
        return api.PubAck.from_response(resp)

    async def publish_events(self, events: Iterable[ev.Event], subject_of: Callable[[ev.Event], str],
                             fence_after_seq: int | None = None, fence_filter: str | None = None,
                             extra_headers: dict | None = None,
                             context_of: Callable[[ev.Event], object] | None = None) -> list[api.PubAck]:
        """Publish in order (pipelined); with ``fence_after_seq``, the first append expects it as
        the last and is confirmed before the others are sent. ``context_of(event)`` gives the
        trace context an event carries (its workload's trace; None: the current one)."""
        tasks = []
        results: list = []
        for i, e in enumerate(events):
            # one stream serves every cluster: the dedup id names the cluster too
            headers = {"Nats-Msg-Id": f"{e.cluster}/{e.event_id}", "Timeshare-Event-Type": ev.event_type(e)}
            inject_context(headers, context_of(e) if context_of is not None else None)
            if extra_headers:
                headers.update(extra_headers)
            if fence_after_seq is not None and i == 0:
                # only the first append of a batch is fenced (sequences of the shared stream are
                # not contiguous per cluster), and it is confirmed before the rest leaves: a
                # refused writer (deposed, or rebuilt from part of the log) slips no tail in
                headers["Nats-Expected-Last-Subject-Sequence"] = str(fence_after_seq)
                headers["Nats-Expected-Last-Subject-Sequence-Subject"] = fence_filter
                results.append(await self._request(subject_of(e), ev.encoder.encode(e), headers))
                continue
            # the coroutines start in order, so the messages leave in order
            tasks.append(asyncio.ensure_future(self._request(subject_of(e), ev.encoder.encode(e), headers)))
        if not tasks:
            return results
        rest = await asyncio.gather(*tasks, return_exceptions=True)
        for r in rest:
            if isinstance(r, BaseException):
                raise r
        return results + list(rest)

    async def propose(self, event: ev.Event) -> api.PubAck:
        """Send an event to placement's inbox (it validates and appends it to the log)."""
        (ack,) = await self.publish_events(
            [event], lambda e: subjects.inbox_subject(self.cluster, ev.event_type(e)))
        return ack

    async def dead_letter(self, consumer: str, msg, reason: str) -> None:
        # a header value must stay on one line and hold no NUL (the reason may quote bad input)
        clean = "".join(c if c.isprintable() else " " for c in reason)[:1000]
        headers = {"Timeshare-Reason": clean, "Timeshare-Subject": msg.subject}
        try:
            md = msg.metadata
            headers["Timeshare-Stream-Seq"] = str(md.sequence.stream)
            headers["Nats-Msg-Id"] = f"dlq.{consumer}.{md.sequence.stream}"
        except Exception:
            pass
        log.warning("dead letter from %s: %s (%s)", consumer, reason, msg.subject)
        await self.js.publish(subjects.dlq_subject(consumer), msg.data, headers=headers)

    # -- consuming --------------------------------------------------------------------------
    async def consume(self, stream: str, durable: str, handle: Callable[[list], Awaitable[None]],
                      stop: asyncio.Event, batch: int = 500, start_after_seq: int | None = None,
                      idle_timeout_s: float = 0.25) -> None:
        """Fetch batches from a durable pull consumer and hand them to ``handle``; then ack the last.

        ``start_after_seq`` (the sequence the caller's store last recorded) moves the durable
        back when its store is behind it (an in-memory store after a restart): the consumer
        is recreated to start right after that sequence."""
        if start_after_seq is not None:
            await self._align_durable(stream, durable, start_after_seq)
        sub = await self.js.pull_subscribe_bind(durable, stream)
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(batch, timeout=idle_timeout_s)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    continue
                if not msgs:
                    continue
                await handle(msgs)
                await msgs[-1].ack()  # AckAll: acks the whole batch
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def rewind_to_ack_floor(self, stream: str, durable: str) -> None:
        """Deliver again everything the durable delivered but nobody acked (a killed holder's
        batch), now rather than after ack_wait and before a later AckAll could cover it."""
        info = await self.js.consumer_info(stream, durable)
        if not info.num_ack_pending:
            return
        await self._align_durable(stream, durable, info.ack_floor.stream_seq if info.ack_floor else 0, force=True)

    async def _align_durable(self, stream: str, durable: str, after_seq: int, force: bool = False) -> None:
        info = await self.js.consumer_info(stream, durable)
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        if floor <= after_seq and not force:
            return  # the durable is at or behind the store: duplicates are skipped by sequence
        cfg = info.config
        await self.js.delete_consumer(stream, durable)
        # named: created through CONSUMER.CREATE.<stream>.<name>.<filter>, the only form a
        # service's NATS user may use (its filter is checked by the server)
        cfg.name = durable
        cfg.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
        cfg.opt_start_seq = after_seq + 1
        await self.js.add_consumer(stream, cfg)

    async def replay(self, stream: str, filter_subject: str, on_msg: Callable[[object], None],
                     start_seq: int = 1) -> int:
        """Read every stored message on ``filter_subject`` from ``start_seq``; returns the last seq seen.

        A fetch that times out does not mean the end (a loaded machine, a slow server): the
        consumer says whether anything is still pending. Stopping early would rebuild a
        leader's state from part of the log."""
        last = start_seq - 1
        info = await self.js.stream_info(stream)
        if info.state.last_seq < start_seq:
            return last
        cfg = api.ConsumerConfig(filter_subject=filter_subject, ack_policy=api.AckPolicy.NONE,
                                 deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq,
                                 inactive_threshold=30.0, mem_storage=True)
        sub = await self.js.pull_subscribe(filter_subject, stream=stream, config=cfg)
        try:
            while True:
                try:
                    msgs = await sub.fetch(2000, timeout=0.3)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    if (await sub.consumer_info()).num_pending == 0:
                        break
                    continue
                for m in msgs:
                    on_msg(m)
                    last = m.metadata.sequence.stream
                if msgs and msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return last


async def follow(bus: Bus, stream: str, filter_subject: str, on_batch, stop: asyncio.Event,
                 start_seq: int = 1, caught_up: asyncio.Event | None = None, name: str = "follower",
                 status: dict | None = None) -> None:
    """Read ``filter_subject`` from ``start_seq`` and keep following it (no durable state).

    ``on_batch(msgs, live)``: ``live`` is False while the stored history is being replayed.
    The ephemeral consumer behind it does not survive a NATS restart: whenever fetching fails,
    or the consumer is found gone while idle, a new one starts right after the last message
    handed to ``on_batch`` (supervised: logged, retried with backoff, never silent)."""
    from .supervise import supervise

    pos = {"next": start_seq, "live": False}
    if status is not None:
        status.setdefault("resubscribed", 0)

    async def run() -> None:
        cfg = api.ConsumerConfig(filter_subject=filter_subject, ack_policy=api.AckPolicy.NONE,
                                 deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=pos["next"],
                                 inactive_threshold=30.0, mem_storage=True)
        info = await bus.js.stream_info(stream)
        if not pos["live"] and info.state.last_seq < pos["next"]:
            pos["live"] = True
            if caught_up is not None:
                caught_up.set()
        epoch = bus.reconnects
        sub = await bus.js.pull_subscribe(filter_subject, stream=stream, config=cfg)
        last_check = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(1000, timeout=0.25)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    msgs = []
                if bus.reconnects != epoch:
                    # messages in flight when the connection dropped are gone (no acks, no
                    # redelivery): start a new consumer right after the last one handled
                    log.warning("%s: NATS reconnected; following again from seq %d", name, pos["next"])
                    if status is not None:
                        status["resubscribed"] += 1
                    return
                if msgs:
                    await on_batch(msgs, pos["live"])
                    pos["next"] = msgs[-1].metadata.sequence.stream + 1
                elif time.monotonic() - last_check > 2.0:
                    await sub.consumer_info()  # NotFoundError once NATS lost it: start a new one
                    last_check = time.monotonic()
                if status is not None:
                    status["next_seq"] = pos["next"]
                    if msgs:
                        status["lag"] = msgs[-1].metadata.num_pending
                    status["last_progress"] = time.monotonic()
                if not pos["live"] and (msgs[-1].metadata.num_pending == 0 if msgs
                                        else (await sub.consumer_info()).num_pending == 0):
                    pos["live"] = True
                    if caught_up is not None:
                        caught_up.set()
                    await on_batch([], True)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    def on_error(exc: BaseException) -> None:
        if status is not None:
            status["last_error"] = f"{type(exc).__name__}: {exc}"
            status["errors"] = status.get("errors", 0) + 1

    while not stop.is_set():  # run() returns after a reconnect: start it again at once
        await supervise(name, run, stop, max_wait_s=2.0, on_error=on_error, restart_on_return=False)


def decode_event(data: bytes) -> ev.Event:
    return ev.decoder.decode(data)


def reply_json(obj) -> bytes:
    return msgspec.json.encode(obj)
