"""User and admin commands of the live system, a thin client of the gateway (httpx).

    timeshare submit --project tulu/rl --gpus 8 --work 2h --min-runtime 1h [--resumable]
    timeshare status <id> | cancel <id> | queue | nodes
    timeshare budget show | budget set tulu/rl=4 tulu/code=2 --reason "..." | budget history

The gateway is TIMESHARE_URL (default http://127.0.0.1:8080), the token TIMESHARE_TOKEN;
``--json`` prints the gateway's answer as is, for scripts. Registered by timeshare.cli.
"""

from __future__ import annotations

import json
import os
import sys

import httpx

from timeshare.durations import parse_duration_s


def _client(args) -> httpx.Client:
    token = args.token or os.environ.get("TIMESHARE_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=args.url or os.environ.get("TIMESHARE_URL", "http://127.0.0.1:8080"),
                        headers=headers, timeout=30)


def _call(args, method: str, path: str, **kwargs):
    try:
        with _client(args) as http:
            r = http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        print(f"timeshare: cannot reach the gateway ({exc}); set TIMESHARE_URL", file=sys.stderr)
        raise SystemExit(2)
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"detail": r.text}
    if r.status_code >= 400:
        detail = body.get("detail") if isinstance(body, dict) else body
        print(f"timeshare: {r.status_code}: {detail}", file=sys.stderr)
        raise SystemExit(1)
    return body


def _out(args, body, text: str) -> int:
    print(json.dumps(body, indent=2, sort_keys=True) if args.json else text)
    return 0


def _cmd_submit(args) -> int:
    body = {"project": args.project, "gpu_type": args.gpu_type, "gpus": args.gpus,
            "work_s": parse_duration_s(args.work), "min_runtime_s": parse_duration_s(args.min_runtime),
            "resumable": args.resumable, "priority": args.priority, "kind": args.kind,
            "command": args.command or None}
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    r = _call(args, "POST", "/v1/workloads", json=body, headers=headers)
    return _out(args, r, f"submitted {r['workload_id']} ({args.gpus} x {args.gpu_type} for {args.project})"
                         + (" [same key as before: same workload]" if r.get("replayed") else ""))


def _cmd_status(args) -> int:
    r = _call(args, "GET", f"/v1/workloads/{args.id}")
    lines = [f"{r['id']}: {r['state']} ({r['gpus']} x {r['gpu_type']}, {r['project']}, user {r['user']}, "
             f"attempt {r['attempt']}, preempted {r['preemptions']}x)"]
    if r.get("placement"):
        lines.append("  on " + ", ".join(f"{p['node']} GPUs {p['gpu_ids']}" for p in r["placement"]))
    if r.get("last_reason"):
        lines.append(f"  last reason: {r['last_reason'].get('message') or r['last_reason'].get('kind')}")
    for h in r.get("history", []):
        lines.append(f"  {h['at_ms']:>15}  {h['type']}")
    return _out(args, r, "\n".join(lines))


def _cmd_cancel(args) -> int:
    r = _call(args, "DELETE", f"/v1/workloads/{args.id}")
    return _out(args, r, f"{r['workload_id']}: {r['state']}")


def _cmd_queue(args) -> int:
    r = _call(args, "GET", "/v1/queue", params={"limit": args.limit, **({"gpu_type": args.gpu_type} if args.gpu_type else {})})
    lines = [f"{r['pending']} pending (scheduling order; ratio = usage / share of the leaf, lower goes first)",
             f"{'#':>4}  {'workload':<28} {'project':<22} {'gpus':>4} {'phase':<11} {'ratio':>8}"]
    for w in r["workloads"]:
        ratio = "-" if w["leaf_ratio"] is None else f"{w['leaf_ratio']:.3f}"
        lines.append(f"{w['position']:>4}  {w['workload_id']:<28} {w['project']:<22} {w['gpus']:>4} {w['phase']:<11} {ratio:>8}")
    return _out(args, r, "\n".join(lines))


def _cmd_nodes(args) -> int:
    r = _call(args, "GET", "/v1/nodes")
    lines = [f"{'node':<12} {'type':<6} {'state':<9} {'free':>4}/{'gpus':<4} workloads"]
    for n in r["nodes"]:
        lines.append(f"{n['name']:<12} {n['gpu_type']:<6} {n['state']:<9} {n['free']:>4}/{n['gpus']:<4} "
                     f"{', '.join(n['workloads'])}")
    return _out(args, r, "\n".join(lines))


def _cmd_budget_show(args) -> int:
    r = _call(args, "GET", "/v1/allocations")
    lines = [f"{'allocation':<28} {'share':>6} {'fraction':>9}  usage ratio per GPU type"]
    for path, n in r["nodes"].items():
        depth = path.count("/")
        ratios = ", ".join(f"{gt} {u['ratio']:.3f}" if u["ratio"] is not None else f"{gt} -" for gt, u in n["usage"].items())
        lines.append(f"{'  ' * depth + path.rsplit('/', 1)[-1]:<28} {n['share']:>6g} {n['fraction']:>9.3f}  {ratios}")
    return _out(args, r, "\n".join(lines))


def _cmd_budget_set(args) -> int:
    shares = {}
    for item in args.shares:
        path, sep, value = item.partition("=")
        if not sep:
            print(f"timeshare: {item!r}: expected path=share", file=sys.stderr)
            return 2
        shares[path] = float(value)
    r = _call(args, "PUT", "/v1/allocations", json={"shares": shares, "reason": args.reason})
    lines = [f"budget changed ({r['event_id']}):"]
    lines += [f"  {p}: {c['old']} -> {c['new']}" for p, c in r["changed"].items()]
    return _out(args, r, "\n".join(lines))


def _cmd_budget_history(args) -> int:
    r = _call(args, "GET", "/v1/allocations/history")
    lines = []
    for h in r["changes"]:
        diff = {p: (h["old"].get(p), v) for p, v in h["new"].items() if h["old"].get(p) != v}
        lines.append(f"{h['at_ms']}  {h['by']}: {h['reason']}  " + ", ".join(f"{p} {o}->{n}" for p, (o, n) in diff.items()))
    return _out(args, r, "\n".join(lines) or "no budget changes yet")


def add_parsers(sub) -> None:
    def common(p):
        p.add_argument("--url", help="gateway URL (default $TIMESHARE_URL or http://127.0.0.1:8080)")
        p.add_argument("--token", help="bearer token (default $TIMESHARE_TOKEN)")
        p.add_argument("--json", action="store_true", help="print the gateway's JSON answer")
        return p

    p = common(sub.add_parser("submit", help="submit a workload to the live scheduler"))
    p.add_argument("--project", required=True)
    p.add_argument("--gpu-type", default="H100")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--work", required=True, help="declared work time (e.g. 2h)")
    p.add_argument("--min-runtime", default="0", help="protected minimum runtime (0 = unallocated)")
    p.add_argument("--resumable", action="store_true")
    p.add_argument("--priority", default="normal")
    p.add_argument("--kind", default="other")
    p.add_argument("--idempotency-key")
    p.add_argument("command", nargs="*", help="command for the process executor (after --)")
    p.set_defaults(func=_cmd_submit)
    for name, fn, helptext in (("status", _cmd_status, "a workload's state and history"),
                               ("cancel", _cmd_cancel, "cancel a workload")):
        p = common(sub.add_parser(name, help=helptext))
        p.add_argument("id")
        p.set_defaults(func=fn)
    p = common(sub.add_parser("queue", help="pending work in scheduling order"))
    p.add_argument("--gpu-type")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_cmd_queue)
    p = common(sub.add_parser("nodes", help="nodes, their state and work"))
    p.set_defaults(func=_cmd_nodes)
    budget = sub.add_parser("budget", help="the allocation tree (show / set / history)")
    bsub = budget.add_subparsers(dest="budget_command", required=True)
    p = common(bsub.add_parser("show", help="shares, fractions and usage ratios"))
    p.set_defaults(func=_cmd_budget_show)
    p = common(bsub.add_parser("set", help="change shares: path=share ..."))
    p.add_argument("shares", nargs="+")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=_cmd_budget_set)
    p = common(bsub.add_parser("history", help="the audit log of budget changes"))
    p.set_defaults(func=_cmd_budget_history)
