"""The dashboard (`/ui`) and the JSON routes it needs beyond the API's own.

The pages are static HTML shells plus one vanilla script (``static/app.js``) that calls the JSON
API with the user's bearer token. They are not rendered on the server because a browser does not
send a bearer token with a page load: the token is given once (``/ui#token=...``, which stays in
the browser, or the form on the page) and kept in the browser's localStorage. Every asset is
served from this package: the dashboard must work on a machine without internet.

Routes added here (``mount``): ``/`` -> ``/ui``; ``/ui``, ``/ui/queue``, ``/ui/cluster``,
``/ui/workloads/{id}`` (pages); ``/ui/static/*``; ``GET /v1/whoami``; ``GET /v1/cluster`` (every
GPU and the workload holding it); ``GET /v1/workloads/{id}/trace`` (the spans of its trace
kept in memory, see ``services.common.telemetry``).
"""

# no `from __future__ import annotations`: the routes' `Auth` is a local name FastAPI must see
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from timeshare.rules import free_at_s
from timeshare.units import ms_to_s

from ..common import telemetry

STATIC = Path(__file__).parent / "static"

PAGES = {"tree": "Allocation tree", "queue": "Queue", "cluster": "Cluster now", "workload": "Workload"}

#: a workload id as the pages accept it in a URL (ids are made by the gateway or given by users;
#: anything else is refused before it reaches the page)
_ID = re.compile(r"^[A-Za-z0-9._:@+-]{1,256}$")


def _page(page: str, title: str, workload_id: str = "") -> HTMLResponse:
    nav = "".join(f'<a href="/ui{"" if p == "tree" else "/" + p}" class="{"on" if p == page else ""}">{t}</a>'
                  for p, t in PAGES.items() if p != "workload")
    html = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - timeshare</title>
<link rel="stylesheet" href="/ui/static/app.css"><link rel="icon" href="/ui/static/favicon.svg">
</head><body data-page="{page}" data-workload="{workload_id}">
<header><span class="brand">timeshare</span><nav>{nav}</nav>
<form id="open-workload"><input name="id" placeholder="workload id" aria-label="workload id"><button>open</button></form>
<form id="token-form"><span id="whoami"></span><input name="token" type="password" placeholder="bearer token"
 aria-label="bearer token"><button>use token</button></form></header>
<main id="app"><h1>{title}</h1><p class="muted" id="status">loading...</p></main>
<script src="/ui/static/app.js"></script>
</body></html>"""
    # the page holds no data: it may be cached briefly, the data is fetched with the token
    return HTMLResponse(html, headers={"Cache-Control": "no-cache"})


def mount(app: FastAPI, gw, auth_dependency, ask) -> None:
    """Add the dashboard's pages and routes to the gateway's app.

    ``auth_dependency`` is the gateway's ``Annotated[Caller, Depends(caller)]``; ``ask`` its
    NATS request helper (raises the gateway's 503 / 4xx)."""
    Auth = auth_dependency

    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui")

    @app.get("/ui", include_in_schema=False)
    async def tree_page() -> HTMLResponse:
        return _page("tree", PAGES["tree"])

    @app.get("/ui/queue", include_in_schema=False)
    async def queue_page() -> HTMLResponse:
        return _page("queue", PAGES["queue"])

    @app.get("/ui/cluster", include_in_schema=False)
    async def cluster_page() -> HTMLResponse:
        return _page("cluster", PAGES["cluster"])

    @app.get("/ui/workloads/{workload_id}", include_in_schema=False)
    async def workload_page(workload_id: str) -> HTMLResponse:
        if not _ID.match(workload_id):
            raise HTTPException(400, "workload id: letters, digits and ._:@+- only, at most 256 characters")
        return _page("workload", f"Workload {workload_id}", workload_id)

    @app.get("/v1/whoami", tags=["operations"])
    async def whoami(who: Auth) -> dict:
        """The caller this token stands for: user, the subtrees it manages, admin or not, the
        leaves it is a member of."""
        return who.to_dict()

    @app.get("/v1/cluster", tags=["nodes"])
    async def cluster_now(who: Auth) -> dict:
        """Every node and each of its GPUs with the workload holding it (project, user, allocated
        or not, protected until when; ``notice`` when it is preempted with notice: since when, the
        deadline by which the GPUs are free at the latest, the preemptor waiting for them), from
        placement's nodes and the gateway's workloads."""
        nodes = (await ask(_query(gw, "nodes")))["nodes"]
        now_ms = gw.clock.now_ms()
        now_s = ms_to_s(now_ms)
        holders: dict[tuple[str, int], dict[str, Any]] = {}
        running = [d for _, d in await gw.store.scan("workload") if d.get("state") == "running"]
        for d in running:
            protected_until_ms = d.get("protected_until_ms")
            free_at = free_at_s(bool(d.get("allocated")),
                                ms_to_s(protected_until_ms) if protected_until_ms is not None else None, now_s)
            entry = {"workload_id": d["id"], "project": d["project"], "user": d["user"],
                     "allocated": bool(d.get("allocated")), "protected_until_ms": protected_until_ms,
                     # protected: its GPUs cannot be freed now (allocated work inside its minimum
                     # runtime); everything else may be preempted (the core's rule)
                     "protected": free_at > now_s}
            if d.get("notice"):
                # preempted with notice: it keeps these GPUs while it checkpoints, until it reports
                # the checkpoint or the deadline; then they go to the preemptor named here
                entry["notice"] = {k: d["notice"].get(k) for k in
                                   ("at_ms", "deadline_ms", "by_workload_id", "by_project", "checkpointed_ms")}
            for part in d.get("placement") or []:
                for gpu in part["gpu_ids"]:
                    holders[(part["node"], gpu)] = entry
        out = []
        for n in nodes:
            gpus = [{"gpu": i, **holders.get((n["name"], i), {"workload_id": None})} for i in range(n["gpus"])]
            # free GPUs held for a preemptor awaiting its victims under notice (placement counts
            # them per node; which free ones is not tracked: the first free ones are shown)
            held = [pid for pid, count in sorted((n.get("held") or {}).items()) for _ in range(count)]
            for g in gpus:
                if held and g["workload_id"] is None:
                    g["held_for"] = held.pop(0)
            out.append({"name": n["name"], "gpu_type": n["gpu_type"], "rack": n["rack"], "state": n["state"],
                        "free": n["free"], "gpus": gpus})
        return {"now_ms": now_ms, "nodes": out}

    @app.get("/v1/metrics", tags=["operations"])
    async def metrics_now(who: Auth) -> dict:
        """The OpenTelemetry metrics of the services in this process, collected now (queue
        length, queue waits by kind, busy GPUs allocated / unallocated, occupancy, usage ratio
        per tree node, preemptions by reason, drains, HTTP durations). Kept when
        ``TIMESHARE_OTEL`` is ``memory`` or ``otlp``; the devstack runs every service in one
        process, so all of them are here."""
        snapshot = telemetry.metrics_snapshot()
        if snapshot is None:
            return {"metrics": {}, "note": "metrics are not kept in this gateway (TIMESHARE_OTEL is not 'memory' or 'otlp')"}
        # this gateway's cluster only (a process may hold several: the tests'); HTTP metrics have none
        for metric in snapshot.values():
            metric["points"] = [p for p in metric["points"] if p["attributes"].get("cluster", gw.cluster) == gw.cluster]
        return {"cluster": gw.cluster, "metrics": snapshot}

    @app.get("/v1/workloads/{workload_id}/trace", tags=["workloads"])
    async def workload_trace(workload_id: str, who: Auth) -> dict:
        """The spans of the workload's trace (HTTP request, submission, the passes that decided
        about it with their reasons, executor) that the services keep in memory
        (``TIMESHARE_OTEL=memory``, the devstack's default, or ``otlp``): this process's, and
        every other service process's gathered over NATS. In a trace viewer, search the tag
        ``timeshare.workload_id``."""
        doc = await gw.store.get("workload", workload_id)
        if doc is None:
            raise HTTPException(404, f"unknown workload {workload_id!r}")
        # its spans name the user, the project and the SQL of the services: the same rule as
        # the workload itself (issue 22, finding 5: every token read every trace)
        if not who.may_see(doc):
            raise HTTPException(403, f"{who.user} may see the trace only of their own workloads or those of "
                                     "subtrees they manage")
        # this process's spans and those every other process of the cluster keeps (placement and
        # the executor deployed apart), gathered over NATS for a moment
        out = await telemetry.gather_trace(gw.bus, gw.cluster, workload_id)
        if out["trace_id"] is None and telemetry.span_store() is None:
            out["note"] = "no service keeps traces (TIMESHARE_OTEL is neither 'memory' nor 'otlp')"
        return {"workload_id": workload_id, **out}


def _query(gw, name: str) -> str:
    from ..common import subjects

    return subjects.query_subject(gw.cluster, name)
