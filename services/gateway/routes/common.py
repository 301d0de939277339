"""What every route module of the gateway shares: the API's version, the refusals documented on
every operation, the 503 for a service that does not answer, and ``Calls`` (the bearer-token
dependency and the helpers that ask the other services over NATS), made once per app.
"""

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any, Callable

import msgspec
import nats
from fastapi import Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from ...common import payload, telemetry
from ...common.auth import Caller
from ...common.ids import new_id
from ...common.supervise import describe
from .. import limits
from ..limits import check_id
from ..publish import NotPublished, propose_confirmed

API_VERSION = "v1"


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


@dataclass(frozen=True)
class Calls:
    """The gateway's helpers for routes, bound to one Gateway service (``calls_for``)."""

    #: ``who: Auth`` in a route: the caller of a valid bearer token (else 401)
    Auth: Any
    #: an ``Idempotency-Key`` header of a command
    IdemKey: Any
    visible_workload: Callable
    ask: Callable
    propose_or_503: Callable
    unconfirmed_detail: Callable
    request_id_for: Callable
    command: Callable


def calls_for(gw) -> Calls:
    """``gw`` is the Gateway service (settings, config, bus, store, projection, tokens, clock)."""
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
        out = payload.decode(msg)
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
        out = payload.decode(msg)
        if isinstance(out, dict) and out.get("error") and out.get("status"):
            raise HTTPException(int(out["status"]), out["error"])
        if isinstance(out, dict) and out.get("state") == "unconfirmed":
            return JSONResponse(status_code=202, content=out)
        return out

    return Calls(Auth=Auth, IdemKey=IdemKey, visible_workload=visible_workload, ask=ask,
                 propose_or_503=propose_or_503, unconfirmed_detail=unconfirmed_detail,
                 request_id_for=request_id_for, command=command)
