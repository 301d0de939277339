"""Settings of every service, read from ``TIMESHARE_*`` environment variables (only here)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CLUSTER_FILE = str(ROOT / "infra" / "demo" / "cluster.toml")


@dataclass
class Settings:
    #: NATS server URL(s), comma separated
    nats_url: str = "nats://127.0.0.1:4222"
    #: NATS passwords per service user: a JSON object {user: password} or a path to one
    #: (services/common/nats_auth.py); empty: connect without credentials
    nats_credentials: str = ""
    #: TLS to NATS (with a tls:// URL): the CA that signed the server's certificate, and an
    #: optional client certificate and key (a server with verify: true asks for one)
    nats_tls_ca: str = ""
    nats_tls_cert: str = ""
    nats_tls_key: str = ""
    #: PostgreSQL DSN, or "memory" for the in-memory store rebuilt from the stream
    database_url: str = "memory"
    #: scenario/cluster file with [[pools]], [allocations] and [policy] (a simulator scenario works)
    cluster_file: str = DEFAULT_CLUSTER_FILE
    #: cluster name (subjects, consumers); defaults to the file's `name`
    cluster: str = ""
    #: "wall" (production) or "manual" (in-process driver; passes only on ticks)
    clock: str = "wall"
    #: stream replicas (1 on a laptop, 3 on a NATS cluster)
    replicas: int = 1
    #: JetStream duplicate window for Nats-Msg-Id dedup
    duplicate_window_s: float = 120.0
    #: gateway HTTP address
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    #: the gateway closes a connection whose request (headers and body) has not fully arrived
    #: within this many seconds of its opening or of the previous response (slow sockets)
    http_read_timeout_s: float = 10.0
    #: the gateway serves HTTPS with this certificate and key (both or neither)
    http_tls_cert: str = ""
    http_tls_key: str = ""
    #: bearer tokens: a JSON object or a path to a JSON file {token: {user, manages: [...], admin}}
    tokens: str = ""
    #: placement lease time-to-live; a standby takes over this long after the holder dies
    lease_ttl_s: float = 5.0
    #: placement runs a pass at least this often even without events (ratios move with time)
    pass_interval_s: float = 30.0
    #: completions first: a workload protected to the end of its declared work ends when its
    #: protection ends; placement defers its pass up to this long after that end for the
    #: executor's report, instead of preempting the workload as it completes (0 = off;
    #: services/placement/completions.py)
    completion_grace_s: float = 1.0
    #: executor kind: "simulated" (work_s x time_scale seconds) or "process" (runs spec.command)
    executor: str = "simulated"
    time_scale: float = 1.0
    #: process executor: SIGTERM, then SIGKILL after this grace (a workload that declared
    #: checkpoint_on_notice_s gets its notice instead: SIGTERM at the notice, SIGKILL at its deadline)
    kill_grace_s: float = 10.0
    #: executor's data: each workload's checkpoint directory, <dir>/<cluster>/checkpoints/<workload
    #: id>, given to its processes as TIMESHARE_CHECKPOINT_DIR and kept across attempts ("" =
    #: .run/executor in this checkout)
    executor_data_dir: str = ""
    #: health: a node that sent heartbeats and then none for this long is unhealthy (0 = off)
    heartbeat_timeout_s: float = 30.0
    #: health: shell command run when a node is drained (env TIMESHARE_NODE); exit 0 = repaired
    repair_command: str = ""
    #: OpenTelemetry exporter: "none", "console" or "otlp" (OTEL_EXPORTER_OTLP_ENDPOINT)
    otel: str = "none"
    log_level: str = "INFO"
    #: a projection retrying (a server away) or with messages waiting and no progress for
    #: this long is "stuck": /healthz answers 503 and names it
    stuck_after_s: float = 30.0
    #: placement snapshots its state every this many appended events (0 = never); a new
    #: leader loads the snapshot and replays only the log after it
    snapshot_every: int = 10000
    #: placement forgets a workload this many seconds of cluster (event) time after it ended
    #: for good, each time it snapshots (0 = never). Without it the state and every snapshot
    #: grow with history (13.6 MB at 100k events) and a new leader's start-up with them. An
    #: hour: long enough that a late executor report or cancel still meets the workload and
    #: is refused with its real reason ("stale report", "already ended") rather than "unknown",
    #: far beyond JetStream's dedup window (120 s); what ended stays in the gateway's store
    forget_ended_after_s: float = 3600.0
    #: a service run on its own (python -m services.<name>) also serves GET /healthz over HTTP
    #: on this port of http_host (0 = off; the gateway's own /healthz is on its HTTP port)
    health_port: int = 0
    #: placement purges the log below what its snapshots and every durable projection cover:
    #: "auto" (on unless TIMESHARE_DATABASE_URL is memory: an in-memory projection rebuilds
    #: from the whole stream), "on" or "off"
    purge_log: str = "auto"
    #: gateway: a user (not an admin) with this many pending workloads is refused more (429); 0 = no limit
    max_pending_per_user: int = 1000

    @property
    def purges_log(self) -> bool:
        if self.purge_log not in ("auto", "on", "off"):
            raise ValueError(f"TIMESHARE_PURGE_LOG must be auto, on or off, got {self.purge_log!r}")
        return self.purge_log == "on" or (self.purge_log == "auto" and self.database_url != "memory")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides) -> "Settings":
        env = os.environ if env is None else env
        kwargs = {}
        for f in fields(cls):
            raw = env.get("TIMESHARE_" + f.name.upper())
            if raw is None:
                continue
            kwargs[f.name] = f.type_cast(raw) if hasattr(f, "type_cast") else _cast(f.type, raw, f.name)
        kwargs.update(overrides)
        return cls(**kwargs)

    def env(self) -> dict[str, str]:
        """These settings as environment variables (to start a service in a subprocess)."""
        return {"TIMESHARE_" + f.name.upper(): str(getattr(self, f.name)) for f in fields(self)}

    def nats_credential_table(self) -> dict[str, str]:
        raw = self.nats_credentials.strip()
        if not raw:
            return {}
        if not raw.startswith("{"):
            raw = Path(raw).read_text()
        table = json.loads(raw)
        if not isinstance(table, dict):
            raise ValueError("TIMESHARE_NATS_CREDENTIALS: expected a JSON object {user: password}")
        return table

    def token_table(self) -> dict[str, dict]:
        raw = self.tokens.strip()
        if not raw:
            return {}
        if not raw.startswith("{"):
            raw = Path(raw).read_text()
        table = json.loads(raw)
        if not isinstance(table, dict):
            raise ValueError("TIMESHARE_TOKENS: expected a JSON object {token: {user, manages, admin}}")
        return table


def _cast(type_name, raw: str, name: str):
    t = type_name if isinstance(type_name, str) else type_name.__name__
    try:
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
    except ValueError:
        raise ValueError(f"TIMESHARE_{name.upper()}: expected a number, got {raw!r}") from None
    return raw
