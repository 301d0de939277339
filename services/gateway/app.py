"""The submission gateway: HTTP (FastAPI), bearer tokens, OpenAPI at /openapi.json.

Thin: validate -> propose an event to placement's inbox (Nats-Msg-Id = event id) -> answer.
Reads come from the gateway's projection of the log (workloads, history, nodes) or are asked
of the service that owns the answer over NATS request/reply (queue order and tree usage from
placement, budget changes and their audit log from budget, the attainment report from the
ledger, node liveness from health).
"""


import hashlib
from typing import Annotated, Any, Literal

import msgspec
import nats
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field

from timeshare import events as ev
from timeshare.cluster import PlacementError
from timeshare.explain import rejected_sentence
from timeshare.tree import MAX_PATH_CHARS, MAX_SHARE, TreeError
from timeshare.workload import ContractError, WorkloadSpec, check_contract

from ..common import healthz as health_reports
from ..common import subjects, telemetry
from ..common.auth import Caller
from ..common.supervise import describe, is_transient
from ..common.ids import new_id, submitted_id, workload_id_for_key
from . import limits, ui
from .publish import NotPublished, propose_confirmed
from .text_guard import TextGuard
from .limits import check_id

API_VERSION = "v1"


class SubmitResponse(BaseModel):
    workload_id: str
    cluster: str
    state: str
    replayed: bool = Field(description="true when this Idempotency-Key was seen before (same workload)")


class CancelResponse(BaseModel):
    workload_id: str
    state: str


# the range of a share is checked by the budget service (400 naming the path, like a new
# node's name); here only what JSON cannot carry safely further (NaN, inf) is refused
Share = float
TreePath = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]
Reason = Annotated[str, Field(min_length=1, max_length=limits.MAX_REASON_CHARS)]


class BudgetChangeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shares: dict[TreePath, Share] = Field(description="path -> new share among its siblings (new paths are "
                                                      f"added); 0 = no budget, at most {MAX_SHARE:g}",
                                          min_length=1, max_length=1000)
    reason: Reason = Field(description="why (kept in the audit log)")


class BudgetRemoveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: TreePath = Field(description="the node to retire: it and everything below it must hold no "
                                       "pending or running work")
    reason: Reason = Field(description="why (kept in the audit log)")


class HealthReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    reason: Annotated[str, Field(max_length=limits.MAX_REASON_CHARS)] = ""
    needs_human: bool = False


class ErrorBody(BaseModel):
    detail: Any = Field(description="what was refused and why, naming the field (a list of them for a 422 "
                                    "of FastAPI's own body validation)")


#: every refusal the gateway may answer, documented on every operation (schemathesis checks it)
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorBody, "description": text} for status, text in (
        (400, "a field breaks the contract or a limit (named in detail)"),
        (401, "no or unknown bearer token"), (403, "not allowed for this caller"), (404, "unknown"),
        (409, "conflicts with the current state (idempotency key, ended workload, work under a node)"),
        (413, "request body over the limit"), (422, "a field unknown, missing or of the wrong type or range"),
        (429, "too many pending workloads for this user"), (503, "a service is not answering; retry"))}


class Unavailable(Exception):
    pass


#: what ``GET /v1/workloads?state=`` accepts (anything else: 422 naming the choices)
WorkloadState = Literal["pending", "running", "completed", "failed", "cancelled", "preempted"]


def state_matches(doc: dict, state: str) -> bool:
    """Whether a workload of the projection is in ``state``; "preempted" also holds work a
    preemption sent back to the queue that has not started since (its state is "pending")."""
    if state == "preempted":
        return doc["state"] == "preempted" or (
            doc["state"] == "pending" and doc.get("last_event") in ("workload.preempted", "workload.requeued"))
    return doc["state"] == state

def ended_explanation(doc: dict) -> dict:
    """What the core's explanation says of ended work (its state, "Completed."), from this
    store's document: placement no longer holds work that ended long ago."""
    return {"workload_id": doc["id"], "state": doc["state"], "project": doc["project"], "gpu_type": doc["gpu_type"],
            "gpus": doc["gpus"], "summary": f"{doc['state'].capitalize()}.", "ended_ms": doc["ended_ms"]}


def create_app(gw) -> FastAPI:
    """``gw`` is the Gateway service (settings, config, bus, store, projection, tokens, clock)."""
    # /docs and /redoc with Swagger UI and ReDoc served from fastapi-offline's files, not a CDN
    app = FastAPIOffline(title="timeshare gateway", version="1.0.0",
                  description="Submit GPU workloads against budgets of GPU time; see the queue in scheduling "
                              "order; manage the allocation tree. Authenticate with `Authorization: Bearer <token>`.",
                  responses=ERROR_RESPONSES)
    cluster = gw.cluster
    # text that is not UTF-8 (a lone surrogate) is a 400 before the app sees it (issue 22, finding 4)
    app.add_middleware(TextGuard)
    # every body is bounded before it is read (a 10 MB body of unknown fields was accepted);
    # added last: the outer one, so TextGuard reads a bounded body
    app.add_middleware(limits.BodyLimit)

    @app.exception_handler(Unavailable)
    async def unavailable(_request: Request, exc: Unavailable):
        return JSONResponse(status_code=503, headers={"Retry-After": "1"}, content={"detail": str(exc)})

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

    # declared as OpenAPI's bearer scheme, so /docs has an Authorize button for "Try it out";
    # the header is read as before (``auto_error=False``: the 401s below stay the gateway's)
    bearer = HTTPBearer(auto_error=False, scheme_name="token",
                        description="a gateway token (`timeshare token new`; the devstack's: dev-admin, dev-user, ...)")

    async def caller(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> Caller:
        authorization = request.headers.get("authorization")
        if not authorization or not authorization.lower().startswith("bearer "):
            raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        who = gw.tokens.lookup(authorization.split(None, 1)[1].strip())
        if who is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return who

    Auth = Annotated[Caller, Depends(caller)]

    async def visible_workload(workload_id: str, who: Caller, action: str = "see") -> dict:
        """The workload's document when the caller may see it: 400 for a malformed id, 404 for an
        unknown one, 403 for someone else's outside the subtrees the caller manages."""
        check_id("workload_id", workload_id)
        doc = await gw.store.get("workload", workload_id)
        if doc is None:
            raise HTTPException(404, f"unknown workload {workload_id!r} (just submitted? it appears once placement "
                                     "has accepted it)")
        if not who.may_see(doc):
            raise HTTPException(403, f"{who.user} may {action} only their own workloads or those of subtrees "
                                     "they manage")
        return doc

    async def ask(subject: str, body: dict | None = None, timeout: float = 5.0) -> Any:
        headers: dict = {}
        telemetry.inject_context(headers)  # the service's handler span joins this request's trace
        try:
            msg = await gw.bus.nc.request(subject, msgspec.json.encode(body or {}), timeout=timeout,
                                          headers=headers or None)
        except Exception:
            raise Unavailable(f"no answer from {subject.split('.')[-1]} service ({subject}); is it running?") from None
        out = msgspec.json.decode(msg.data)
        if isinstance(out, dict) and out.get("error") and out.get("status"):
            raise HTTPException(int(out["status"]), out["error"])
        return out

    async def propose_or_503(event, what: str) -> bool:
        """True: in placement's inbox. False: it may be (answered with the id to ask about).
        503 only when it is known not to be there (issue 22, finding 2)."""
        try:
            return await propose_confirmed(gw.bus, event)
        except NotPublished as exc:
            raise Unavailable(f"the {what} was not recorded (NATS: {exc}); nothing was done, send it again") \
                from None

    def unconfirmed_detail(wid: str) -> str:
        return (f"the submission was sent but not confirmed (NATS reconnecting): it may be in the log. "
                f"GET /{API_VERSION}/workloads/{wid} says, or send the same request again (same id or "
                "Idempotency-Key): it runs at most once")

    IdemKey = Annotated[str | None, Header(
        description="the same key again (same caller) repeats the first answer and changes nothing more",
        max_length=limits.MAX_ID_CHARS)]

    def request_id_for(who: Caller, key: str | None) -> str:
        """The command's id (the budget change's event id): from the caller's Idempotency-Key,
        so a retry is the same change (deduplicated), else fresh."""
        if not key:
            return new_id("budget")
        return "budget." + hashlib.sha256(f"{who.user}/{key}".encode()).hexdigest()[:32]

    async def command(subject: str, body: dict, timeout: float = 10.0):
        """A command to the service that owns it: 503 only when it was not sent (off NATS) or
        nobody listens; no answer in time is 202 "unconfirmed" with the request id (it may have
        been applied: the budget service applied changes answered 503 under load, finding 2)."""
        headers: dict = {}
        telemetry.inject_context(headers)
        try:
            msg = await gw.bus.nc.request(subject, msgspec.json.encode(body), timeout=timeout,
                                          headers=headers or None)
        except (nats.errors.TimeoutError, TimeoutError):
            return JSONResponse(status_code=202, content={
                "state": "unconfirmed", "request_id": body.get("request_id"),
                "detail": f"sent, but {subject.split('.')[-2]} did not answer in {timeout:g}s: it may be applied. "
                          f"GET /{API_VERSION}/allocations/history says; send it again with the same "
                          "Idempotency-Key to be sure (it is applied at most once)"})
        except Exception as exc:
            raise Unavailable(f"not sent ({describe(exc)}): nothing was done, send it again") from None
        out = msgspec.json.decode(msg.data)
        if isinstance(out, dict) and out.get("error") and out.get("status"):
            raise HTTPException(int(out["status"]), out["error"])
        if isinstance(out, dict) and out.get("state") == "unconfirmed":
            return JSONResponse(status_code=202, content=out)
        return out

    @app.get("/healthz", tags=["operations"],
             responses={503: {"description": "not ok: the report names the service or projection at fault",
                              "content": {"application/json": {"schema": {"type": "object"}}}}})
    async def healthz(response: Response,
                      authorization: Annotated[str | None, Header(description="Bearer <token>: the whole report")] = None) -> dict:
        """Every service's report: each consumer's applied sequence, lag and last error; 503 when
        a service does not answer, is off NATS, or has a projection stuck. Without a valid bearer
        token only ``ok`` (and the status code): the report names consumers, errors and the
        leader (issue 22, finding 6)."""
        own = health_reports.projector_report("gateway", [gw.projector], gw.bus)
        others = await health_reports.gather(gw.bus, cluster)
        missing = sorted(n for n, r in others.items() if r is None)
        services = {"gateway": own, **{n: r or {"service": n, "ok": False, "error": "no answer"}
                                       for n, r in others.items()}}
        ok = all(r["ok"] for r in services.values())
        response.status_code = 200 if ok else 503
        token = authorization.split(None, 1)[1].strip() if authorization and " " in authorization.strip() else ""
        if not (authorization or "").lower().startswith("bearer ") or gw.tokens.lookup(token) is None:
            return {"ok": ok, "detail": "the full report needs a bearer token"}
        return {"ok": ok, "cluster": cluster, "projection_seq": gw.projector.applied_seq, "missing": missing,
                "services": services}

    @app.post(f"/{API_VERSION}/workloads", status_code=202, response_model=SubmitResponse, tags=["workloads"],
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": limits.submit_schema()}}}},
              responses={403: {"model": ErrorBody, "description": "not a member of the project's leaf"}})
    async def submit(request: Request, who: Auth,
                     idempotency_key: Annotated[str | None, Header(
                         description="the same key twice gives the same workload",
                         max_length=limits.MAX_ID_CHARS)] = None):
        # decoded with msgspec rather than a pydantic body parameter: the hottest endpoint;
        # strict: an unknown field (a typo such as min_runtme_s) is refused, not ignored
        req = limits.decode_submit(await request.body())
        limits.check_notice(req, gw.config.policy.max_notice_s)
        if idempotency_key:
            wid = req.id or workload_id_for_key(who.user, idempotency_key)
        else:
            wid = req.id or new_id("w")
        trace.get_current_span().set_attributes({"timeshare.workload_id": wid, "timeshare.cluster": cluster})  # its trace starts here
        now_ms = gw.clock.now_ms()
        spec = WorkloadSpec(id=wid, submit_s=now_ms // 1000, project=req.project, gpu_type=req.gpu_type,
                            gpus=req.gpus, work_s=req.work_s, min_runtime_s=req.min_runtime_s,
                            resumable=req.resumable, user=who.user, priority=req.priority, kind=req.kind,
                            checkpoint_interval_s=req.checkpoint_interval_s, command=req.command,
                            checkpoint_on_notice_s=req.checkpoint_on_notice_s, checkpoint_gb=req.checkpoint_gb,
                            suspends_on_notice=req.suspends_on_notice)
        try:
            check_contract(spec, gw.config.policy.max_min_runtime_s, gw.config.policy.max_notice_s)
            gw.projection.tree.require_leaf(spec.project)
            gw.cluster_model.pool(spec.gpu_type).check_request(spec.gpus)
        except ContractError as exc:
            raise HTTPException(400, f"{exc.field}: {exc.message}") from None
        except TreeError as exc:
            raise HTTPException(400, f"project: {exc}") from None
        except PlacementError as exc:
            raise HTTPException(400, f"{'gpu_type' if spec.gpu_type not in gw.cluster_model.pools else 'gpus'}: {exc}") from None
        if not who.may_submit_to(req.project):
            raise HTTPException(403, f"project: {who.user} is not a member of {req.project!r} "
                                     f"(member of: {', '.join(who.member_of) or 'nothing'}; "
                                     f"manages: {', '.join(who.manages) or 'nothing'})")
        max_pending = gw.settings.max_pending_per_user
        if max_pending and not who.admin and gw.projection.pending_by_user.get(who.user, 0) >= max_pending:
            raise HTTPException(429, f"pending: {who.user} has {gw.projection.pending_by_user[who.user]} pending "
                                     f"workloads, the limit is {max_pending}; wait for some to start or cancel some")
        replayed = False
        if idempotency_key:
            body_hash = hashlib.sha256(msgspec.json.encode(req)).hexdigest()
            if req.id and await gw.store.get("workload", wid) is not None:
                # an id in use is a 409 with a key as without one, unless this key made it
                # (issue 22, finding 3: it answered 202 and the work never ran)
                mine = await gw.store.get("idem", f"{who.user}/{idempotency_key}")
                if mine is None or mine["workload_id"] != wid:
                    raise HTTPException(409, f"id: workload {wid!r} already exists")
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
        confirmed = await propose_or_503(event, "submission")
        body = {"workload_id": wid, "cluster": cluster, "state": "submitted" if confirmed else "unconfirmed",
                "replayed": replayed}
        if not confirmed:
            body["detail"] = unconfirmed_detail(wid)
        return Response(msgspec.json.encode(body), status_code=202, media_type="application/json")

    @app.get(f"/{API_VERSION}/workloads/{{workload_id}}", tags=["workloads"])
    async def get_workload(workload_id: str, who: Auth) -> dict:
        doc = await visible_workload(workload_id, who)
        doc["history"] = await gw.store.journal("workload", workload_id)
        return doc

    @app.get(f"/{API_VERSION}/workloads/{{workload_id}}/explain", tags=["workloads"])
    async def explain_workload(workload_id: str, who: Auth) -> dict:
        """Why it waits, runs or was preempted, in plain language with the numbers: its position in
        the order the scheduler takes work, its team's ordering key at every level of the tree,
        what it waits for (the protection that ends first), and its latest preemption's reason."""
        doc = await visible_workload(workload_id, who)
        try:
            out = await ask(subjects.query_subject(cluster, "explain"), {"id": workload_id})
        except HTTPException as exc:
            # placement forgets work an hour after it ended (TIMESHARE_FORGET_ENDED_AFTER_S);
            # this store is the durable record of every workload and answers for it
            if exc.status_code != 404 or doc.get("ended_ms") is None:
                raise
            out = {"explanation": ended_explanation(doc)}
        explanation = out.get("explanation", {}) if isinstance(out, dict) else {}
        if doc.get("last_reason"):
            explanation["last_preemption"] = doc["last_reason"]
            message = doc["last_reason"].get("message")
            if message:
                # the candidates it spared, from the same reason the decision span shows
                spared = rejected_sentence(doc["last_reason"])
                stopped = f"Last stopped: {message}" + (f". {spared}" if spared else "")
                explanation["summary"] = f"{explanation.get('summary', '')} {stopped}".strip()
        spans = telemetry.span_store()  # its trace, when this process keeps traces
        if spans is not None:
            explanation["trace_id"] = spans.trace_of(cluster, workload_id)
        return explanation

    @app.get(f"/{API_VERSION}/workloads", tags=["workloads"])
    async def list_workloads(who: Auth, state: WorkloadState | None = None, preempted: bool = False,
                             user: Annotated[str | None, Query(max_length=limits.MAX_LABEL_CHARS)] = None,
                             limit: Annotated[int, Query(ge=0, le=10000)] = 200) -> dict:
        """Workloads the caller may see: their own, those of subtrees they manage (admins: all).
        ``state=preempted``: stopped by a preemption and not run since (ended, or requeued and
        waiting again); ``preempted=true``: preempted at least once, whatever the state now."""
        rows = [d for _, d in await gw.store.scan("workload") if who.may_see(d)]
        if state:
            rows = [d for d in rows if state_matches(d, state)]
        if preempted:
            rows = [d for d in rows if d.get("preemptions", 0) > 0]
        if user:
            rows = [d for d in rows if d["user"] == user]
        rows.sort(key=lambda d: (d["submitted_ms"], d["id"]))
        return {"workloads": [{k: d[k] for k in ("id", "project", "user", "gpu_type", "gpus", "state", "attempt",
                                                  "submitted_ms", "started_ms", "ended_ms", "preemptions")}
                              for d in rows[:limit]], "total": len(rows)}

    @app.delete(f"/{API_VERSION}/workloads/{{workload_id}}", status_code=202, response_model=CancelResponse,
                tags=["workloads"])
    async def cancel(workload_id: str, who: Auth):
        doc = await visible_workload(workload_id, who, "cancel")
        if doc["state"] in ("completed", "failed", "cancelled", "preempted"):
            raise HTTPException(409, f"{workload_id} already ended ({doc['state']})")
        event = ev.WorkloadCancelled(event_id=f"cancel.{workload_id}", at_ms=gw.clock.now_ms(), cluster=cluster,
                                     workload_id=workload_id, by=who.user)
        confirmed = await propose_or_503(event, "cancellation")
        return CancelResponse(workload_id=workload_id, state="cancelling" if confirmed else "unconfirmed")

    @app.get(f"/{API_VERSION}/queue", tags=["scheduling"])
    async def queue(who: Auth, gpu_type: Annotated[str | None, Query(max_length=limits.MAX_LABEL_CHARS)] = None,
                    limit: Annotated[int, Query(ge=0, le=100000)] = 1000) -> dict:
        """Pending work in scheduling order, each with its ordering key (phase, then (ratio, path)
        per tree level from the top, then -priority, submit time, id)."""
        return await ask(subjects.query_subject(cluster, "queue"), {"gpu_type": gpu_type, "limit": limit})

    @app.get(f"/{API_VERSION}/allocations", tags=["budgets"])
    async def allocations(who: Auth) -> dict:
        """The allocation tree: shares, fractions, rolling-window usage and usage ratio per GPU type."""
        return await ask(subjects.query_subject(cluster, "tree"))

    @app.put(f"/{API_VERSION}/allocations", tags=["budgets"])
    async def change_allocations(req: BudgetChangeRequest, who: Auth, idempotency_key: IdemKey = None) -> dict:
        """Change shares. Managers change the children of nodes they manage; admins anything.
        A new node's name is lower case letters, digits, '.', '_' or '-'; a leaf holding work
        cannot become a parent (its work would leave the queue); shares are finite, 0..MAX_SHARE."""
        limits.check_text("reason", req.reason)
        for path, share in req.shares.items():
            limits.check_text("shares (a path)", path, MAX_PATH_CHARS)
            limits.check_finite(f"shares.{path}", share)
        return await command(subjects.cmd_subject(cluster, "budget.set"),
                             {"caller": who.to_dict(), "shares": req.shares, "reason": req.reason,
                              "request_id": request_id_for(who, idempotency_key)}, timeout=10)

    @app.post(f"/{API_VERSION}/allocations/remove", tags=["budgets"])
    async def remove_allocation(req: BudgetRemoveRequest, who: Auth, idempotency_key: IdemKey = None) -> dict:
        """Retire a node (and its subtree) that holds no pending or running work. Its manager's
        manager (whoever may change its share) or an admin."""
        limits.check_text("reason", req.reason)
        return await command(subjects.cmd_subject(cluster, "budget.remove"),
                             {"caller": who.to_dict(), "path": req.path, "reason": req.reason,
                              "request_id": request_id_for(who, idempotency_key)}, timeout=10)

    @app.get(f"/{API_VERSION}/allocations/history", tags=["budgets"])
    async def allocation_history(who: Auth) -> dict:
        """Every budget change: who, old and new shares, why (the audit log)."""
        return await ask(subjects.query_subject(cluster, "budget.history"))

    @app.get(f"/{API_VERSION}/report", tags=["budgets"])
    async def report(who: Auth, from_s: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                     to_s: Annotated[float | None, Query(allow_inf_nan=False)] = None) -> dict:
        """GPU-hours owed / delivered and attainment per team over [from_s, to_s)."""
        return await ask(subjects.query_subject(cluster, "ledger.report"), {"from_s": from_s, "to_s": to_s},
                         timeout=30)

    @app.get(f"/{API_VERSION}/report/series", tags=["budgets"])
    async def report_series(who: Auth, node: Annotated[str, Query(max_length=limits.MAX_LABEL_CHARS)] = "",
                            from_s: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                            to_s: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                            bucket_h: Annotated[int | None, Query(ge=1)] = None) -> dict:
        """GPU-hours owed and delivered (funded work) of tree node ``node`` ("" = every team) per
        hour, or per ``bucket_h`` hours, over [from_s, to_s): the report's numbers over time
        (its buckets add up to ``/v1/report`` over the same range). 404 for an unknown node,
        400 for a range the report refuses or more than 500 points."""
        return await ask(subjects.query_subject(cluster, "ledger.series"),
                         {"node": node, "from_s": from_s, "to_s": to_s, "bucket_h": bucket_h}, timeout=30)

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
        check_id("node", node)
        if not who.admin and "health" not in who.manages:
            raise HTTPException(403, "heartbeats need an admin or health-agent token")
        if node not in gw.cluster_model.nodes_by_name:
            raise HTTPException(404, f"unknown node {node!r}")
        try:
            await gw.bus.nc.publish(subjects.heartbeat_subject(cluster), msgspec.json.encode({"node": node}))
        except Exception as exc:  # off NATS: nothing is buffered (gateway/publish.py)
            raise Unavailable(f"heartbeat not sent: {describe(exc)}") from None
        return {"node": node}

    @app.post(f"/{API_VERSION}/nodes/{{node}}/health", tags=["nodes"])
    async def health_report(node: str, report: HealthReport, who: Auth) -> dict:
        check_id("node", node)
        limits.check_text("reason", report.reason)
        if not who.admin and "health" not in who.manages:
            raise HTTPException(403, "health reports need an admin or health-agent token")
        return await ask(subjects.cmd_subject(cluster, "health.report"),
                         {"node": node, "ok": report.ok, "reason": report.reason, "needs_human": report.needs_human,
                          "by": who.user})

    @app.post(f"/{API_VERSION}/nodes/{{node}}/repair", tags=["nodes"])
    async def repaired(node: str, who: Auth) -> dict:
        """Declare a drained or failed node repaired (a human did it)."""
        check_id("node", node)
        if not who.admin:
            raise HTTPException(403, "only admins declare nodes repaired")
        return await ask(subjects.cmd_subject(cluster, "health.repaired"), {"node": node, "by": who.user})

    @app.post(f"/{API_VERSION}/nodes/{{node}}/uncordon", tags=["nodes"])
    async def uncordon(node: str, who: Auth) -> dict:
        """Take back a cordon (a mistaken one): a cordoned or drained node takes work again at once."""
        check_id("node", node)
        if not who.admin:
            raise HTTPException(403, "only admins uncordon nodes")
        return await ask(subjects.cmd_subject(cluster, "health.repaired"),
                         {"node": node, "by": who.user, "uncordon": True})

    ui.mount(app, gw, Auth, ask)
    return app
