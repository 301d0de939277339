"""What the gateway accepts over HTTP: strict bodies, bounded sizes, ids, numbers.

The submission body is a msgspec Struct with ``forbid_unknown_fields`` (a typo such as
``min_runtme_s`` is refused, as the simulator refuses it in a trace line: both decode into
the core's ``WorkloadSpec`` rules) and ``Meta`` constraints, so every refusal names the field
(``... - at `$.gpus```). The same Struct is the OpenAPI schema of ``POST /v1/workloads``
(one source of truth for what is documented and what is enforced). The contract itself (the
minimum-runtime cap, priorities, ...) stays the core's ``check_contract``; this module holds
only the limits an HTTP front door adds on top: sizes and ranges no real workload needs.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

import msgspec
from fastapi import HTTPException

from timeshare.workload import PRIORITIES

#: a request body larger than this is refused with 413 before it is read (a submission is
#: well under 1 kB; a command line of a few hundred arguments fits)
MAX_BODY_BYTES = 64 * 1024
#: ids (workload ids, node names): what a subject token, a URL path segment and a database
#: key all carry without escaping (no '/', no '%', no NUL, no spaces)
ID_PATTERN = r"^[A-Za-z0-9._-]+$"
ID_RE = re.compile(ID_PATTERN)
MAX_ID_CHARS = 128
#: free labels (kind, priority, gpu_type, project paths)
MAX_LABEL_CHARS = 256
#: a single workload never asks for more GPUs than this (the largest cluster in the brief has 1024)
MAX_GPUS = 4096
#: declared work: at most 90 days (longer work is resumable and resubmitted; a bound keeps
#: 1e30 or an overflow out of every sum downstream)
MAX_WORK_S = 90 * 24 * 3600
#: process executor command line
MAX_COMMAND_ARGS = 256
MAX_ARG_CHARS = 4096
#: a reason or free text in a budget change or health report
MAX_REASON_CHARS = 1000

Id = Annotated[str, msgspec.Meta(pattern=ID_PATTERN, min_length=1, max_length=MAX_ID_CHARS)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
Gpus = Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS)]
WorkS = Annotated[int, msgspec.Meta(gt=0, le=MAX_WORK_S)]
MinRuntimeS = Annotated[int, msgspec.Meta(ge=0, le=MAX_WORK_S)]
IntervalS = Annotated[int, msgspec.Meta(gt=0, le=MAX_WORK_S)]
#: seconds a workload needs to checkpoint after SIGTERM; the policy's max_notice_s caps it
#: further (checked by the gateway with the cluster's policy: 422 naming the field)
NoticeS = Annotated[int, msgspec.Meta(ge=0, le=MAX_WORK_S)]
#: a checkpoint's size: at most a petabyte (a bound keeps inf and 1e300 out of the bandwidth sums)
MAX_CHECKPOINT_GB = 1_000_000.0
CheckpointGb = Annotated[float, msgspec.Meta(ge=0, le=MAX_CHECKPOINT_GB)]
Arg = Annotated[str, msgspec.Meta(max_length=MAX_ARG_CHARS)]
Command = Annotated[list[Arg], msgspec.Meta(min_length=1, max_length=MAX_COMMAND_ARGS)]


class SubmitBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A workload to run (``POST /v1/workloads``). Unknown fields are refused."""

    project: Label
    gpu_type: Label
    gpus: Gpus
    work_s: WorkS
    min_runtime_s: MinRuntimeS = 0
    resumable: bool = False
    priority: Label = "normal"
    kind: Label = "other"
    checkpoint_interval_s: IntervalS | None = None
    command: Command | None = None
    id: Id | None = None
    # the notice part of the contract: absent (UNSET) keeps the workload's encoding as before
    checkpoint_on_notice_s: NoticeS | msgspec.UnsetType = msgspec.UNSET
    checkpoint_gb: CheckpointGb | msgspec.UnsetType = msgspec.UNSET
    suspends_on_notice: bool | msgspec.UnsetType = msgspec.UNSET


submit_decoder = msgspec.json.Decoder(SubmitBody, strict=False)


def submit_schema() -> dict:
    """SubmitBody as a JSON Schema object for the OpenAPI document (no $refs: it has none nested)."""
    schema = msgspec.json.schema(SubmitBody)
    body = schema["$defs"]["SubmitBody"]
    docs = {"project": "leaf of the allocation tree the work is charged to (you must be a member), e.g. 'tulu/rl'",
            "gpu_type": "GPU pool, e.g. 'H100'", "gpus": "GPUs (at most one node's, or a multiple of the node size)",
            "work_s": "declared work time in seconds (the simulated executor runs this long)",
            "min_runtime_s": "protected minimum runtime, at most work_s; 0 = unallocated (always preemptible, "
                             "never charged)",
            "resumable": "requeued automatically when preempted",
            "priority": f"order inside the team: {', '.join(PRIORITIES)}",
            "kind": "free label (debug, training, eval...)",
            "checkpoint_interval_s": "resumable work keeps progress at these intervals",
            "command": "process executor: the command to run",
            "id": "workload id (default: derived from Idempotency-Key, or random)",
            "checkpoint_on_notice_s": "seconds it needs to write a checkpoint after SIGTERM: a preemption gives it "
                                      "this notice (it keeps its GPUs until it exits or the notice ends, then "
                                      "SIGKILL); 0 or absent = no notice; at most the policy's max_notice "
                                      "(default 300 s), above it a 422 naming this field",
            "checkpoint_gb": "size of that checkpoint in GB (it shares the cluster's checkpoint bandwidth)",
            "suspends_on_notice": "an interactive session that saves its state on notice and resumes it when it "
                                  "starts again"}
    for name, text in docs.items():
        body["properties"][name]["description"] = text
    return body


def decode_submit(raw: bytes) -> SubmitBody:
    """The body, or HTTP 422 naming the field (unknown, missing, of the wrong type or range)."""
    try:
        req = submit_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HTTPException(422, f"request body: {exc}") from None
    # PostgreSQL cannot store a NUL (jsonb), and a control character in a label is never meant
    for name in ("project", "gpu_type", "priority", "kind"):
        if any(c < " " or c == "\x7f" for c in getattr(req, name)):
            raise HTTPException(400, f"{name}: must not contain a NUL or another control character")
    for i, arg in enumerate(req.command or []):
        if "\x00" in arg:
            raise HTTPException(400, f"command[{i}]: must not contain a NUL character")
    if req.min_runtime_s > req.work_s:
        raise HTTPException(400, f"min_runtime_s: {req.min_runtime_s}s is more than work_s ({req.work_s}s); "
                                 "the protected minimum cannot exceed the work itself")
    return req


def check_notice(req: SubmitBody, max_notice_s: int) -> None:
    """HTTP 422 naming ``checkpoint_on_notice_s`` when it is above the policy's cap (a range the
    cluster's policy sets, so it cannot be in the static schema above)."""
    notice_s = req.checkpoint_on_notice_s
    if notice_s is not msgspec.UNSET and notice_s > max_notice_s:
        raise HTTPException(422, f"checkpoint_on_notice_s: {notice_s}s is above the policy's max_notice of "
                                 f"{max_notice_s}s (checkpoint faster, or checkpoint periodically and declare "
                                 "no notice)")


def check_id(field: str, value: str) -> str:
    """A path id (workload id, node name): HTTP 400 naming the field when it is not one."""
    if not value or len(value) > MAX_ID_CHARS or not ID_RE.match(value):
        raise HTTPException(400, f"{field}: must be 1-{MAX_ID_CHARS} characters of A-Z a-z 0-9 . _ - "
                                 f"(got {value[:40]!r}{'...' if len(value) > 40 else ''})")
    return value


def check_text(field: str, value: str, max_chars: int = MAX_REASON_CHARS) -> str:
    if len(value) > max_chars:
        raise HTTPException(400, f"{field}: at most {max_chars} characters (got {len(value)})")
    if "\x00" in value:
        raise HTTPException(400, f"{field}: must not contain a NUL character")
    return value


def check_finite(field: str, value: float) -> float:
    if not math.isfinite(value):
        raise HTTPException(400, f"{field}: must be a finite number, got {value!r}")
    return value


class BodyLimit:
    """ASGI middleware: refuse a request body over ``max_bytes`` with 413, before the app reads
    it (by Content-Length when given, else while it streams in)."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    return await self._refuse(send, 400, "Content-Length: not a number")
                if size > self.max_bytes:
                    return await self._refuse(send, 413, f"request body: {size} bytes is over the limit of "
                                                         f"{self.max_bytes} bytes")
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, 413, f"request body: over the limit of {self.max_bytes} bytes")

    @staticmethod
    async def _refuse(send, status: int, detail: str) -> None:
        body = msgspec.json.encode({"detail": detail})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
