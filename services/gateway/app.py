"""The submission gateway: HTTP (FastAPI), bearer tokens, OpenAPI at /openapi.json.

Thin: validate -> propose an event to placement's inbox (Nats-Msg-Id = event id) -> answer.
Reads come from the gateway's projection of the log (workloads, history, nodes) or are asked
of the service that owns the answer over NATS request/reply (queue order and tree usage from
placement, budget changes and their audit log from budget, the attainment report from the
ledger, node liveness from health).
"""


import hashlib
from typing import Annotated, Any

import msgspec
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from opentelemetry import trace
from pydantic import BaseModel, Field

from timeshare import events as ev
from timeshare.cluster import PlacementError
from timeshare.tree import TreeError
from timeshare.workload import PRIORITIES, ContractError, WorkloadSpec, check_contract

from ..common import healthz as health_reports
from ..common import subjects, telemetry
from ..common.auth import Caller
from ..common.supervise import describe, is_transient
from ..common.ids import new_id, submitted_id, workload_id_for_key
from . import ui

API_VERSION = "v1"


class SubmitRequest(BaseModel):
    project: str = Field(description="leaf of the allocation tree the work is charged to, e.g. 'tulu/rl'")
    gpu_type: str = Field(description="GPU pool, e.g. 'H100'")
    gpus: int = Field(description="GPUs (at most one node's, or a multiple of the node size)")
    work_s: int = Field(description="declared work time in seconds (the simulated executor runs this long)")
    min_runtime_s: int = Field(0, description="protected minimum runtime; 0 = unallocated (always preemptible, never charged)")
    resumable: bool = Field(False, description="requeued automatically when preempted")
    priority: str = Field("normal", description=f"order inside the team: {', '.join(PRIORITIES)}")
    kind: str = Field("other", description="free label (debug, training, eval...)")
    checkpoint_interval_s: int | None = Field(None, description="resumable work keeps progress at these intervals")
    command: list[str] | None = Field(None, description="process executor: the command to run")
    id: str | None = Field(None, description="workload id (default: derived from Idempotency-Key, or random)")


class _SubmitBody(msgspec.Struct, kw_only=True):
    """SubmitRequest decoded by msgspec (the hot path; SubmitRequest documents it in OpenAPI)."""

    project: str
    gpu_type: str
    gpus: int
    work_s: int
    min_runtime_s: int = 0
    resumable: bool = False
    priority: str = "normal"
    kind: str = "other"
    checkpoint_interval_s: int | None = None
    command: list[str] | None = None
    id: str | None = None


_submit_decoder = msgspec.json.Decoder(_SubmitBody, strict=False)

#: longest label or id a submission may carry (each is a key or a column downstream)
MAX_TEXT = 256


def _text_problem(req: _SubmitBody) -> str | None:
    """A label PostgreSQL cannot store (NUL) or too long to be a key; None when all are fine."""
    for name in ("project", "gpu_type", "priority", "kind", "id"):
        value = getattr(req, name)
        if value is None:
            continue
        if "\x00" in value:
            return f"{name}: must not contain a NUL character"
        if len(value) > MAX_TEXT:
            return f"{name}: at most {MAX_TEXT} characters (got {len(value)})"
    for i, arg in enumerate(req.command or []):
        if "\x00" in arg:
            return f"command[{i}]: must not contain a NUL character"
    return None


class SubmitResponse(BaseModel):
    workload_id: str
    cluster: str
    state: str
    replayed: bool = Field(description="true when this Idempotency-Key was seen before (same workload)")


class CancelResponse(BaseModel):
    workload_id: str
    state: str


class BudgetChangeRequest(BaseModel):
    shares: dict[str, float] = Field(description="path -> new share among its siblings (new paths are added)")
    reason: str = Field(description="why (kept in the audit log)")


class HealthReport(BaseModel):
    ok: bool
    reason: str = ""
    needs_human: bool = False


class Unavailable(Exception):
    pass


def create_app(gw) -> FastAPI:
    """``gw`` is the Gateway service (settings, config, bus, store, projection, tokens, clock)."""
    # /docs and /redoc with Swagger UI and ReDoc served from fastapi-offline's files, not a CDN
    app = FastAPIOffline(title="timeshare gateway", version="1.0.0",
                  description="Submit GPU workloads against budgets of GPU time; see the queue in scheduling "
                              "order; manage the allocation tree. Authenticate with `Authorization: Bearer <token>`.")
    cluster = gw.cluster

    @app.exception_handler(Unavailable)
    async def unavailable(_request: Request, exc: Unavailable):
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    async def store_error(_request: Request, exc: Exception):
        # the store kept trying for a few seconds (PostgreSQL restarting): ask the client to
        # retry (with its Idempotency-Key) rather than answering 500
        if is_transient(exc):
            return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                                content={"detail": f"the gateway's store is unavailable: {describe(exc)}"})
        return JSONResponse(status_code=500, content={"detail": f"internal error: {describe(exc)}"})

    import asyncpg

    for cls in (asyncpg.exceptions.PostgresError, asyncpg.InterfaceError, OSError):
        app.add_exception_handler(cls, store_error)

    async def caller(authorization: Annotated[str | None, Header(description="Bearer <token>")] = None) -> Caller:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        who = gw.tokens.lookup(authorization.split(None, 1)[1].strip())
        if who is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return who

    Auth = Annotated[Caller, Depends(caller)]

    async def ask(subject: str, body: dict | None = None, timeout: float = 5.0) -> Any:
        try:
            msg = await gw.bus.nc.request(subject, msgspec.json.encode(body or {}), timeout=timeout)
        except Exception:
            raise Unavailable(f"no answer from {subject.split('.')[-1]} service ({subject}); is it running?") from None
        out = msgspec.json.decode(msg.data)
        if isinstance(out, dict) and out.get("error") and out.get("status"):
            raise HTTPException(int(out["status"]), out["error"])
        return out

    @app.get("/healthz", tags=["operations"])
    async def healthz(response: Response) -> dict:
        """Every service's report: each consumer's applied sequence, lag and last error; 503 when
        a service does not answer, is off NATS, or has a projection stuck."""
        own = health_reports.projector_report("gateway", [gw.projector], gw.bus)
        others = await health_reports.gather(gw.bus, cluster)
        missing = sorted(n for n, r in others.items() if r is None)
        services = {"gateway": own, **{n: r or {"service": n, "ok": False, "error": "no answer"}
                                       for n, r in others.items()}}
        ok = all(r["ok"] for r in services.values())
        response.status_code = 200 if ok else 503
        return {"ok": ok, "cluster": cluster, "projection_seq": gw.projector.applied_seq, "missing": missing,
                "services": services}

    submit_schema = SubmitRequest.model_json_schema()

    @app.post(f"/{API_VERSION}/workloads", status_code=202, response_model=SubmitResponse, tags=["workloads"],
              openapi_extra={"requestBody": {"required": True,
                                             "content": {"application/json": {"schema": submit_schema}}}})
    async def submit(request: Request, who: Auth,
                     idempotency_key: Annotated[str | None, Header(description="the same key twice gives the same workload")] = None):
        # decoded with msgspec rather than a pydantic body parameter: the hottest endpoint
        try:
            req = _submit_decoder.decode(await request.body())
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise HTTPException(422, f"request body: {exc}") from None
        problem = _text_problem(req)
        if problem:
            raise HTTPException(400, problem)
        if idempotency_key:
            wid = req.id or workload_id_for_key(who.user, idempotency_key)
        else:
            wid = req.id or new_id("w")
        trace.get_current_span().set_attributes({"timeshare.workload_id": wid, "timeshare.cluster": cluster})  # its trace starts here
        now_ms = gw.clock.now_ms()
        spec = WorkloadSpec(id=wid, submit_s=now_ms // 1000, project=req.project, gpu_type=req.gpu_type,
                            gpus=req.gpus, work_s=req.work_s, min_runtime_s=req.min_runtime_s,
                            resumable=req.resumable, user=who.user, priority=req.priority, kind=req.kind,
                            checkpoint_interval_s=req.checkpoint_interval_s, command=req.command)
        try:
            check_contract(spec, gw.config.policy.max_min_runtime_s)
            gw.projection.tree.require_leaf(spec.project)
            gw.cluster_model.pool(spec.gpu_type).check_request(spec.gpus)
        except ContractError as exc:
            raise HTTPException(400, f"{exc.field}: {exc.message}") from None
        except TreeError as exc:
            raise HTTPException(400, f"project: {exc}") from None
        except PlacementError as exc:
            raise HTTPException(400, f"{'gpu_type' if spec.gpu_type not in gw.cluster_model.pools else 'gpus'}: {exc}") from None
        replayed = False
        if idempotency_key:
            body_hash = hashlib.sha256(msgspec.json.encode(req)).hexdigest()
            prior = await gw.store.put_if_absent("idem", f"{who.user}/{idempotency_key}",
                                                 {"workload_id": wid, "hash": body_hash, "at_ms": now_ms})
            if prior is not None:
                if prior["hash"] != body_hash:
                    raise HTTPException(409, "this Idempotency-Key was used with a different request body")
                replayed = True
                wid = prior["workload_id"]
                existing = await gw.store.get("workload", wid)
                if existing is not None:
                    return Response(msgspec.json.encode({"workload_id": wid, "cluster": cluster,
                                                         "state": existing["state"], "replayed": True}),
                                    status_code=202, media_type="application/json")
                spec = msgspec.structs.replace(spec, id=wid)
        elif req.id and await gw.store.get("workload", wid) is not None:  # a fresh random id is new
            raise HTTPException(409, f"id: workload {wid!r} already exists")
        event = ev.WorkloadSubmitted(event_id=submitted_id(wid), at_ms=now_ms, cluster=cluster, workload=spec)
        try:
            await gw.bus.propose(event)
        except Exception as exc:
            raise Unavailable(f"could not publish the submission: {exc}") from None
        return Response(msgspec.json.encode({"workload_id": wid, "cluster": cluster, "state": "submitted",
                                             "replayed": replayed}), status_code=202, media_type="application/json")

    @app.get(f"/{API_VERSION}/workloads/{{workload_id}}", tags=["workloads"])
    async def get_workload(workload_id: str, who: Auth) -> dict:
        doc = await gw.store.get("workload", workload_id)
        if doc is None:
            raise HTTPException(404, f"unknown workload {workload_id!r} (just submitted? it appears once placement "
                                     "has accepted it)")
        doc["history"] = await gw.store.journal("workload", workload_id)
        return doc

    @app.get(f"/{API_VERSION}/workloads/{{workload_id}}/explain", tags=["workloads"])
    async def explain_workload(workload_id: str, who: Auth) -> dict:
        """Why it waits, runs or was preempted, in plain language with the numbers: its position in
        the order the scheduler takes work, its team's ordering key at every level of the tree,
        what it waits for (the protection that ends first), and its latest preemption's reason."""
        doc = await gw.store.get("workload", workload_id)
        if doc is None:
            raise HTTPException(404, f"unknown workload {workload_id!r}")
        out = await ask(subjects.query_subject(cluster, "explain"), {"id": workload_id})
        explanation = out.get("explanation", {}) if isinstance(out, dict) else {}
        if doc.get("last_reason"):
            explanation["last_preemption"] = doc["last_reason"]
            message = doc["last_reason"].get("message")
            if message:
                explanation["summary"] = f"{explanation.get('summary', '')} Last stopped: {message}".strip()
        spans = telemetry.span_store()  # its trace, when this process keeps traces
        if spans is not None:
            explanation["trace_id"] = spans.trace_of(cluster, workload_id)
        return explanation

    @app.get(f"/{API_VERSION}/workloads", tags=["workloads"])
    async def list_workloads(who: Auth, state: str | None = None, user: str | None = None,
                             limit: Annotated[int, Query(le=10000)] = 200) -> dict:
        rows = [d for _, d in await gw.store.scan("workload")]
        if state:
            rows = [d for d in rows if d["state"] == state]
        if user:
            rows = [d for d in rows if d["user"] == user]
        rows.sort(key=lambda d: (d["submitted_ms"], d["id"]))
        return {"workloads": [{k: d[k] for k in ("id", "project", "user", "gpu_type", "gpus", "state", "attempt",
                                                  "submitted_ms", "started_ms", "ended_ms", "preemptions")}
                              for d in rows[:limit]], "total": len(rows)}

    @app.delete(f"/{API_VERSION}/workloads/{{workload_id}}", status_code=202, response_model=CancelResponse,
                tags=["workloads"])
    async def cancel(workload_id: str, who: Auth):
        doc = await gw.store.get("workload", workload_id)
        if doc is None:
            raise HTTPException(404, f"unknown workload {workload_id!r}")
        if doc["user"] != who.user and not who.manages_path(doc["project"]):
            raise HTTPException(403, f"{who.user} may cancel only their own workloads or those of subtrees they manage")
        if doc["state"] in ("completed", "failed", "cancelled", "preempted"):
            raise HTTPException(409, f"{workload_id} already ended ({doc['state']})")
        event = ev.WorkloadCancelled(event_id=f"cancel.{workload_id}", at_ms=gw.clock.now_ms(), cluster=cluster,
                                     workload_id=workload_id, by=who.user)
        await gw.bus.propose(event)
        return CancelResponse(workload_id=workload_id, state="cancelling")

    @app.get(f"/{API_VERSION}/queue", tags=["scheduling"])
    async def queue(who: Auth, gpu_type: str | None = None, limit: Annotated[int, Query(le=100000)] = 1000) -> dict:
        """Pending work in scheduling order, each with its ordering key (phase, then (ratio, path)
        per tree level from the top, then -priority, submit time, id)."""
        return await ask(subjects.query_subject(cluster, "queue"), {"gpu_type": gpu_type, "limit": limit})

    @app.get(f"/{API_VERSION}/allocations", tags=["budgets"])
    async def allocations(who: Auth) -> dict:
        """The allocation tree: shares, fractions, rolling-window usage and usage ratio per GPU type."""
        return await ask(subjects.query_subject(cluster, "tree"))

    @app.put(f"/{API_VERSION}/allocations", tags=["budgets"])
    async def change_allocations(req: BudgetChangeRequest, who: Auth) -> dict:
        """Change shares. Managers change the children of nodes they manage; admins anything."""
        return await ask(subjects.cmd_subject(cluster, "budget.set"),
                         {"caller": who.to_dict(), "shares": req.shares, "reason": req.reason,
                          "request_id": new_id("budget")}, timeout=10)

    @app.get(f"/{API_VERSION}/allocations/history", tags=["budgets"])
    async def allocation_history(who: Auth) -> dict:
        """Every budget change: who, old and new shares, why (the audit log)."""
        return await ask(subjects.query_subject(cluster, "budget.history"))

    @app.get(f"/{API_VERSION}/report", tags=["budgets"])
    async def report(who: Auth, from_s: float | None = None, to_s: float | None = None) -> dict:
        """GPU-hours owed / delivered and attainment per team over [from_s, to_s)."""
        return await ask(subjects.query_subject(cluster, "ledger.report"), {"from_s": from_s, "to_s": to_s},
                         timeout=30)

    @app.get(f"/{API_VERSION}/nodes", tags=["nodes"])
    async def nodes(who: Auth) -> dict:
        out = await ask(subjects.query_subject(cluster, "nodes"))
        try:
            live = await ask(subjects.query_subject(cluster, "health.nodes"), timeout=1.0)
        except (Unavailable, HTTPException):
            live = {"nodes": {}}
        for n in out["nodes"]:
            n["last_heartbeat_ms"] = live["nodes"].get(n["name"], {}).get("last_heartbeat_ms")
        return out

    @app.post(f"/{API_VERSION}/nodes/{{node}}/heartbeat", status_code=202, tags=["nodes"])
    async def heartbeat(node: str, who: Auth) -> dict:
        """A node agent is alive (health marks a node unhealthy when its heartbeats stop)."""
        if not who.admin and "health" not in who.manages:
            raise HTTPException(403, "heartbeats need an admin or health-agent token")
        if node not in gw.cluster_model.nodes_by_name:
            raise HTTPException(404, f"unknown node {node!r}")
        await gw.bus.nc.publish(subjects.heartbeat_subject(cluster), msgspec.json.encode({"node": node}))
        return {"node": node}

    @app.post(f"/{API_VERSION}/nodes/{{node}}/health", tags=["nodes"])
    async def health_report(node: str, report: HealthReport, who: Auth) -> dict:
        if not who.admin and "health" not in who.manages:
            raise HTTPException(403, "health reports need an admin or health-agent token")
        return await ask(subjects.cmd_subject(cluster, "health.report"),
                         {"node": node, "ok": report.ok, "reason": report.reason, "needs_human": report.needs_human,
                          "by": who.user})

    @app.post(f"/{API_VERSION}/nodes/{{node}}/repair", tags=["nodes"])
    async def repaired(node: str, who: Auth) -> dict:
        """Declare a drained or failed node repaired (a human did it)."""
        if not who.admin:
            raise HTTPException(403, "only admins declare nodes repaired")
        return await ask(subjects.cmd_subject(cluster, "health.repaired"), {"node": node, "by": who.user})

    ui.mount(app, gw, Auth, ask)
    return app
