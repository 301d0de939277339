"""The gateway's routes tagged "workloads": submit, read, explain, list and cancel workloads.
"""

# no `from __future__ import annotations`: the routes' `Auth` is a local name FastAPI must see
import hashlib
from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import Response
from opentelemetry import trace
from pydantic import BaseModel, Field

from timeshare import events as ev
from timeshare.cluster import PlacementError
from timeshare.explain import rejected_sentence
from timeshare.tree import TreeError
from timeshare.workload import ContractError, WorkloadSpec, check_contract

from ...common import subjects, telemetry
from ...common.ids import new_id, submitted_id, workload_id_for_key
from .. import limits
from .common import API_VERSION, Calls, ErrorBody


class SubmitResponse(BaseModel):
    workload_id: str
    cluster: str
    state: str
    replayed: bool = Field(description="true when this Idempotency-Key was seen before (same workload)")


class CancelResponse(BaseModel):
    workload_id: str
    state: str


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


def router(gw, calls: Calls) -> APIRouter:
    r = APIRouter(tags=["workloads"])
    cluster = gw.cluster
    Auth, ask, visible_workload = calls.Auth, calls.ask, calls.visible_workload
    propose_or_503, unconfirmed_detail = calls.propose_or_503, calls.unconfirmed_detail

    @r.post(f"/{API_VERSION}/workloads", status_code=202, response_model=SubmitResponse,
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

    @r.get(f"/{API_VERSION}/workloads/{{workload_id}}")
    async def get_workload(workload_id: str, who: Auth) -> dict:
        doc = await visible_workload(workload_id, who)
        doc["history"] = await gw.store.journal("workload", workload_id)
        return doc

    @r.get(f"/{API_VERSION}/workloads/{{workload_id}}/explain")
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

    @r.get(f"/{API_VERSION}/workloads")
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

    @r.delete(f"/{API_VERSION}/workloads/{{workload_id}}", status_code=202, response_model=CancelResponse)
    async def cancel(workload_id: str, who: Auth):
        doc = await visible_workload(workload_id, who, "cancel")
        if doc["state"] in ("completed", "failed", "cancelled", "preempted"):
            raise HTTPException(409, f"{workload_id} already ended ({doc['state']})")
        event = ev.WorkloadCancelled(event_id=f"cancel.{workload_id}", at_ms=gw.clock.now_ms(), cluster=cluster,
                                     workload_id=workload_id, by=who.user)
        confirmed = await propose_or_503(event, "cancellation")
        return CancelResponse(workload_id=workload_id, state="cancelling" if confirmed else "unconfirmed")

    return r
