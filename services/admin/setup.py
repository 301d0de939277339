"""The operator's step: every JetStream stream, durable consumer, KV bucket and object store of
infra/nats.json, created (or brought up to date) with the operator's NATS user.

Services only bind to them: their NATS users may not create, update or delete a stream
(services/common/nats_auth.py), so a service's password cannot put a stream in front of the
query and command subjects (issue 22, finding 1). A service started before this step waits for
it (``Bus.ensure_infra`` retries ``InfraMissing``). Run by ``make run`` (the devstack's
``Stack``), compose (the ``setup`` service) and the test fixtures; safe to run again.
"""

from __future__ import annotations

import logging

from ..common import nats_auth
from ..common.bus import Bus
from ..common.settings import Settings

log = logging.getLogger("timeshare.admin")


async def setup(settings: Settings, clusters: list[str] | tuple[str, ...]) -> list[str]:
    """Create everything for each of ``clusters`` (the streams are shared, the durables are per
    cluster) as the operator; returns what was done, one line per cluster."""
    if settings.nats_credentials and nats_auth.OPERATOR not in settings.nats_credential_table():
        raise ValueError("TIMESHARE_NATS_CREDENTIALS holds no operator password: the setup step "
                         "creates streams, which only the operator's NATS user may")
    done = []
    bus = await Bus.connect(settings, clusters[0], name="admin-setup", role=nats_auth.OPERATOR)
    try:
        for cluster in clusters:
            bus.cluster = cluster
            await bus.create_infra()
            done.append(f"cluster {cluster}: streams, durables, buckets and object stores of infra/nats.json ready")
    finally:
        await bus.close()
    return done
