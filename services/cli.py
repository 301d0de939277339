"""User and admin commands of the live system, a thin client of the gateway (httpx).

    timeshare submit --project tulu/rl --gpus 8 --work 2h30m --min-runtime 1h [--resumable]
                     [--checkpoint-every 30min] [--checkpoint-on-notice 90s] [--checkpoint-gb 40]
                     [--suspends-on-notice]
    timeshare status <id> | explain <id> | cancel <id>
    timeshare workloads [--user alice] [--state running]
    timeshare queue [--user alice] [--project tulu] [--gpu-type H100]
    timeshare nodes | nodes repair <node>
    timeshare budget show | budget set tulu/rl=4 tulu/code=2 --reason "..." | budget history
    timeshare budget remove tulu/old --reason "..."
    timeshare token new --user alice --member-of tulu/rl [--manages tulu] [--admin] [--add-to tokens.json]
    timeshare budget report --from 2d --to now

Durations are written as people do ("2h30m", "2hours", "90min", "1 day"); times are printed in
UTC ("2026-12-01 14:32:05Z"). A value argparse refuses (``--gpus -1``, ``--work lots``,
``budget set x=nan``) is one line on stderr naming the argument, exit status 2, nothing sent.

The gateway is ``--url``, else TIMESHARE_URL, else the stack ``make run`` runs on this checkout
(its address and token are in ``.run/devstack/env``; the CLI says on stderr that it talks to
it), else http://127.0.0.1:8080. The token is ``--token``, else TIMESHARE_TOKEN, else the
devstack's. ``--json`` prints the gateway's answer as is, for scripts. Registered by timeshare.cli.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import httpx

from timeshare.durations import format_duration_s, parse_duration_s
from timeshare.tree import is_within
from timeshare.workload import PRIORITIES

#: the most queue entries the gateway answers at once: a filtered queue asks for all of them
_QUEUE_MAX = 100000

#: where ``make run`` (python -m services.devstack) writes the URL and token of the stack it
#: runs; TIMESHARE_DEVSTACK_ENV names another file (a devstack started with --data DIR: DIR/env)
DEVSTACK_ENV = Path(__file__).resolve().parents[1] / ".run" / "devstack" / "env"
DEFAULT_URL = "http://127.0.0.1:8080"

#: the states ``workloads --state`` accepts; "preempted" is work a preemption stopped that has
#: not run since (ended, or requeued and waiting again)
STATES = ("pending", "running", "completed", "failed", "cancelled", "preempted")


# -- argument types: argparse turns their ArgumentTypeError into "argument --x: message", exit 2 --

def _duration(text: str) -> int:
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _work(text: str) -> int:
    """``--work``: a duration of at least one second (nothing runs for no time)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"expected a duration of at least 1 second, got {text!r}")
    seconds = _duration(text)
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"expected a duration of at least 1 second, got {text!r}")
    return seconds


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return n


def _notice(text: str) -> int:
    """``--checkpoint-on-notice``: a duration >= 0 (0 = no notice; the gateway checks the cap)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"expected a duration such as 90s or 2min, got {text!r}")
    return _duration(text)


def _interval(text: str) -> int:
    """``--checkpoint-every``: a duration of at least one second."""
    return _work(text)


def _gigabytes(text: str) -> float:
    try:
        gb = float(text)
    except ValueError:
        gb = math.nan
    if not math.isfinite(gb) or gb < 0:
        raise argparse.ArgumentTypeError(f"expected a size in GB (a number >= 0), got {text!r}")
    return gb


def _name(text: str) -> str:
    """A workload id or node name: one URL path segment."""
    if text in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"expected a name, got {text!r}")
    return text


def _share(text: str) -> tuple[str, float]:
    path, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected PATH=SHARE (e.g. tulu/rl=4), got {text!r}")
    if not path.strip():
        raise argparse.ArgumentTypeError(f"no path before '=' in {text!r}")
    try:
        share = float(value)
    except ValueError:
        share = math.nan
    if not math.isfinite(share) or share < 0:
        raise argparse.ArgumentTypeError(f"the share of {path!r} must be a number >= 0, got {value!r}")
    return path, share


#: ``--to now``: the ledger's own now (no ``to_s`` sent)
NOW = "now"


def _when(text: str) -> float | str:
    """'now', a duration ago ("2d", "90min"), or a UTC date/time ("2026-12-01", "2026-12-01 14:00")
    -> epoch seconds (or NOW)."""
    if text.strip().lower() == NOW:
        return NOW
    try:
        return time.time() - parse_duration_s(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'now', a duration ago like '2d' or '90min', or a UTC date/time "
                                         f"like '2026-12-01 14:00', got {text!r}") from None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


# -- output helpers --

def _utc(ms: float | None) -> str:
    """Epoch milliseconds as '2026-12-01 14:32:05Z' (UTC whatever the local zone); '-' for none."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _since(start_ms: float | None, end_ms: float | None) -> str:
    return "-" if start_ms is None or end_ms is None else format_duration_s(max(0.0, (end_ms - start_ms) / 1000))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# -- the gateway --

def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` and shell quotes allowed, ``#`` comments) of a file the
    devstack wrote; {} when it is missing or unreadable."""
    import shlex

    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if sep and key.strip():
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            out[key.strip()] = words[0] if words else ""
    return out


def _target(args) -> tuple[str, str, str | None]:
    """(gateway URL, token as given, where they came from when not from the caller): --url,
    TIMESHARE_URL, the devstack's env file (its token too, unless one is given), the default."""
    token = args.token or os.environ.get("TIMESHARE_TOKEN", "")
    url = args.url or os.environ.get("TIMESHARE_URL", "")
    if url:
        return url, token, None
    path = Path(os.environ.get("TIMESHARE_DEVSTACK_ENV") or DEVSTACK_ENV)
    env = read_env_file(path)
    if env.get("TIMESHARE_URL"):
        return env["TIMESHARE_URL"], token or env.get("TIMESHARE_TOKEN", ""), str(path)
    return DEFAULT_URL, token, None


def _client(args) -> httpx.Client:
    url, token, source = _target(args)
    token = token.strip()
    if token and not (token.isascii() and token.isprintable() and token.split() == [token]):
        source = "argument --token" if args.token else "TIMESHARE_TOKEN"
        print(f"timeshare: {source}: a token is printable ASCII without spaces", file=sys.stderr)
        raise SystemExit(2)
    if source is not None and not getattr(args, "_said_where", False):
        # say it once per command: a stack found in a file is not one the user named
        print(f"timeshare: the devstack at {url} (from {source}; TIMESHARE_URL for another)", file=sys.stderr)
        args._said_where = True
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def _call(args, method: str, path: str, **kwargs):
    try:
        with _client(args) as http:
            r = http.request(method, path, **kwargs)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        url, _, source = _target(args)
        hint = (f"is `make run` still running? ({source})" if source is not None
                else "start one with `make run`, or set TIMESHARE_URL")
        print(f"timeshare: cannot reach the gateway at {url} ({exc}); {hint}", file=sys.stderr)
        raise SystemExit(2)
    try:
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"detail": r.text}
    except ValueError:
        body = {"detail": r.text}
    if r.status_code >= 400:
        detail = body.get("detail") if isinstance(body, dict) else body
        print(f"timeshare: {r.status_code}: {detail}", file=sys.stderr)
        raise SystemExit(1)
    return body


def _out(args, body, text: str) -> int:
    print(json.dumps(body, indent=2, sort_keys=True) if args.json else text)
    return 0


def _path(*parts: str) -> str:
    """A URL path with each user-given part escaped (an id with '/' or '?' stays one segment)."""
    return "/".join(quote(p, safe="") if i else p for i, p in enumerate(parts))


# -- commands --

def _cmd_submit(args) -> int:
    body = {"project": args.project, "gpu_type": args.gpu_type, "gpus": args.gpus,
            "work_s": args.work, "min_runtime_s": args.min_runtime,
            "resumable": args.resumable, "priority": args.priority, "kind": args.kind,
            "command": args.command or None}
    # the notice fields only when given: a submission without them is the same body as before
    for key, value in (("checkpoint_interval_s", args.checkpoint_every),
                       ("checkpoint_on_notice_s", args.checkpoint_on_notice),
                       ("checkpoint_gb", args.checkpoint_gb),
                       ("suspends_on_notice", True if args.suspends_on_notice else None)):
        if value is not None:
            body[key] = value
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    r = _call(args, "POST", "/v1/workloads", json=body, headers=headers)
    if args.quiet and not args.json:
        print(r["workload_id"])
        return 0
    return _out(args, r, f"submitted {r['workload_id']} ({args.gpus} x {args.gpu_type} for {args.project}, "
                         f"work {format_duration_s(args.work)})"
                         + (" [same key as before: same workload]" if r.get("replayed") else ""))


def _cmd_status(args) -> int:
    r = _call(args, "GET", _path("/v1/workloads", args.id))
    lines = [f"{r['id']}: {r['state']} ({r['gpus']} x {r['gpu_type']}, {r['project']}, user {r['user']}, "
             f"attempt {r['attempt']}, preempted {r['preemptions']}x)"]
    times = [f"submitted {_utc(r.get('submitted_ms'))}"]
    if r.get("started_ms") is not None:
        times.append(f"first started {_utc(r['started_ms'])} (after {_since(r.get('submitted_ms'), r['started_ms'])})")
    if r.get("ended_ms") is not None:
        times.append(f"ended {_utc(r['ended_ms'])}")
    lines.append("  " + ", ".join(times))
    if r.get("protected_until_ms") is not None:
        lines.append(f"  protected (minimum runtime) until {_utc(r['protected_until_ms'])}")
    if r.get("placement"):
        lines.append("  on " + ", ".join(f"{p['node']} GPUs {p['gpu_ids']}" for p in r["placement"]))
    notice = r.get("notice")
    if notice:  # preempted with notice: checkpointing, its GPUs free by the deadline at the latest
        lines.append(f"  under notice since {_utc(notice.get('at_ms'))}: "
                     + (f"checkpointed {_utc(notice['checkpointed_ms'])}" if notice.get("checkpointed_ms")
                        else "checkpointing")
                     + f", GPUs free by {_utc(notice.get('deadline_ms'))} at the latest"
                     + (f" (for {notice['by_workload_id']})" if notice.get("by_workload_id") else ""))
    if r.get("last_reason"):
        lines.append(f"  last reason: {r['last_reason'].get('message') or r['last_reason'].get('kind')}")
    for h in r.get("history", []):
        lines.append(f"  {_utc(h['at_ms'])}  {h['type']}")
    return _out(args, r, "\n".join(lines))


def _cmd_explain(args) -> int:
    r = _call(args, "GET", _path("/v1/workloads", args.id) + "/explain")
    lines = [r.get("summary", "")]
    for level in r.get("levels", []):
        fill = "-" if level.get("fill") is None else f"{level['fill']:.0%}"
        ratio = "-" if level.get("ratio") is None else f"{level['ratio']:.2f}"
        lines.append(f"  {level['subtree']}: runs {level['running_gpus']} of {level['due_gpus']:.1f} GPUs due now "
                     f"({fill}), usage ratio {ratio}")
    if r.get("ahead"):
        lines.append("  ahead of it: " + ", ".join(r["ahead"]))
    if r.get("trace_id"):
        lines.append(f"  trace {r['trace_id']} (timeshare trace {args.id})")
    return _out(args, r, "\n".join(lines))


#: span attributes `trace` prints after a span's name (the preemption's numbers among them)
_TRACE_KEYS = ("timeshare.nodes", "timeshare.allocated", "timeshare.protected_until_ms", "timeshare.exit_code")


def _cmd_trace(args) -> int:
    r = _call(args, "GET", _path("/v1/workloads", args.id) + "/trace")
    spans = r.get("spans") or []
    if not spans:
        return _out(args, r, f"{args.id}: no spans kept" + (f" ({r['note']})" if r.get("note") else ""))
    t0 = min(s["start_ms"] for s in spans)
    by_id = {s["span_id"]: s for s in spans}

    def depth(s) -> int:
        d = 0
        while s.get("parent_id") in by_id and d < 20:
            s, d = by_id[s["parent_id"]], d + 1
        return d

    lines = [f"trace {r['trace_id']}: {len(spans)} spans (start offset, duration)"]
    for s in spans:
        attrs = s.get("attributes", {})
        extra = [f"{k.rsplit('.', 1)[-1]}={attrs[k]}" for k in _TRACE_KEYS if k in attrs]
        extra += [f"{k.split('.', 2)[-1]}={v}" for k, v in sorted(attrs.items())
                  if k.startswith("timeshare.preemption.") and not k.endswith(".message")]
        if attrs.get("timeshare.appended") is False:
            extra.append("NOT IN THE LOG (its leader was deposed)")
        lines.append(f"  {s['start_ms'] - t0:>9.1f} ms {s['end_ms'] - s['start_ms']:>8.2f} ms  {'  ' * depth(s)}{s['name']}"
                     + (f"  [{', '.join(extra)}]" if extra else ""))
        for e in s.get("events", []):
            if e.get("name") == "rejected":  # a candidate the preemption spared, and why
                a = e.get("attributes", {})
                lines.append(f"  {'':>27}{'  ' * depth(s)}  spared {a.get('timeshare.rejected.workload_id')} "
                             f"({a.get('timeshare.rejected.reason')}): {a.get('timeshare.rejected.message')}")
    return _out(args, r, "\n".join(lines))


def _cmd_cancel(args) -> int:
    r = _call(args, "DELETE", _path("/v1/workloads", args.id))
    return _out(args, r, f"{r['workload_id']}: {r['state']}")


def _mine(args) -> None:
    """``--mine``: the token's user, as the gateway knows it (GET /v1/whoami)."""
    if getattr(args, "mine", False):
        args.user = _call(args, "GET", "/v1/whoami")["user"]


def _cmd_whoami(args) -> int:
    r = _call(args, "GET", "/v1/whoami")
    roles = (["admin"] if r.get("admin") else []) + [f"manages {m}" for m in r.get("manages", [])]
    return _out(args, r, r["user"] + (f" ({', '.join(roles)})" if roles else ""))


def _cmd_workloads(args) -> int:
    _mine(args)
    params = {"limit": args.limit, **({"user": args.user} if args.user else {}),
              **({"state": args.state} if args.state else {}), **({"preempted": "true"} if args.preempted else {})}
    r = _call(args, "GET", "/v1/workloads", params=params)
    rows = r["workloads"]
    if args.quiet and not args.json:
        print("\n".join(w["id"] for w in rows))
        return 0
    lines = [f"{len(rows)} of {r['total']} workloads" + (f" of user {args.user}" if args.user else "")
             + (f" in state {args.state}" if args.state else "")
             + (" preempted at least once" if args.preempted else "")
             + " (wait = submission to first start, ended = submission to end)",
             f"{'workload':<28} {'project':<20} {'user':<10} {'gpus':>4} {'type':<6} {'state':<10} "
             f"{'submitted (UTC)':<20} {'wait':>7} {'ended':>7} {'preempted':>9}"]
    for w in rows:
        lines.append(f"{w['id']:<28} {w['project']:<20} {w['user']:<10} {w['gpus']:>4} {w['gpu_type']:<6} "
                     f"{w['state']:<10} {_utc(w['submitted_ms']):<20} {_since(w['submitted_ms'], w['started_ms']):>7} "
                     f"{_since(w['submitted_ms'], w['ended_ms']):>7} {w['preemptions']:>9}")
    return _out(args, r, "\n".join(lines))


def _cmd_queue(args) -> int:
    _mine(args)
    filtered = bool(args.user or args.project)
    params = {"limit": _QUEUE_MAX if filtered else args.limit, **({"gpu_type": args.gpu_type} if args.gpu_type else {})}
    r = _call(args, "GET", "/v1/queue", params=params)
    if filtered:  # the gateway's body, with only the matching workloads (positions in the whole queue)
        r["workloads"] = [w for w in r["workloads"]
                          if (not args.user or w.get("user") == args.user)
                          and (not args.project or is_within(w["project"], args.project))][:args.limit]
    what = " and ".join(f"{k} {v}" for k, v in (("user", args.user), ("project", args.project)) if v)
    lines = [f"{r['pending']} pending" + (f", {len(r['workloads'])} of {what} shown" if filtered else "")
             + " (scheduling order; ratio = usage / share of the leaf, lower goes first)",
             f"{'#':>4}  {'workload':<28} {'project':<22} {'user':<10} {'gpus':>4} {'phase':<11} {'ratio':>8} "
             f"{'waiting':>8}"]
    now_s = r.get("now_s")
    for w in r["workloads"]:
        ratio = "-" if w["leaf_ratio"] is None else f"{w['leaf_ratio']:.3f}"
        since = w.get("queued_since_s")
        waiting = "-" if now_s is None or since is None else format_duration_s(max(0.0, now_s - since))
        lines.append(f"{w['position']:>4}  {w['workload_id']:<28} {w['project']:<22} {w.get('user') or '-':<10} "
                     f"{w['gpus']:>4} {w['phase']:<11} {ratio:>8} {waiting:>8}")
    return _out(args, r, "\n".join(lines))


def _cmd_nodes(args) -> int:
    r = _call(args, "GET", "/v1/nodes")
    lines = [f"{'node':<12} {'type':<6} {'state':<9} {'free':>4}/{'gpus':<4} workloads"]
    for n in r["nodes"]:
        held = ", ".join(f"{count} held for {pid}" for pid, count in sorted((n.get("held") or {}).items()))
        lines.append(f"{n['name']:<12} {n['gpu_type']:<6} {n['state']:<9} {n['free']:>4}/{n['gpus']:<4} "
                     f"{', '.join(n['workloads'])}" + (f" ({held}: its victims under notice checkpoint)" if held else ""))
    return _out(args, r, "\n".join(lines))


def _cmd_nodes_cordon(args) -> int:
    # a cordon is the health report "unhealthy": no new work; its work drains as it reaches its
    # minimum runtime (never earlier); then repaired by TIMESHARE_REPAIR_COMMAND or `nodes repair`
    r = _call(args, "POST", _path("/v1/nodes", args.node, "health"),
              json={"ok": False, "reason": args.reason, "needs_human": args.needs_human})
    return _out(args, r, f"{r['node']}: {r['state']}" + (f" ({r['note']})" if r.get("note") else
                                                         " (drains as its work reaches its minimum runtime)"))


def _cmd_nodes_uncordon(args) -> int:
    # a mistaken cordon: the node takes work again at once (what its drain preempted stays preempted)
    r = _call(args, "POST", _path("/v1/nodes", args.node, "uncordon"))
    return _out(args, r, f"{r['node']}: back in service ({r['event_id']})")


def _cmd_nodes_repair(args) -> int:
    r = _call(args, "POST", _path("/v1/nodes", args.node, "repair"))
    return _out(args, r, f"{r['node']}: declared repaired ({r['event_id']})")


def _cmd_budget_show(args) -> int:
    r = _call(args, "GET", "/v1/allocations")
    lines = [f"{'allocation':<28} {'share':>6} {'fraction':>9}  usage ratio per GPU type"]
    for path, n in r["nodes"].items():
        depth = path.count("/")
        ratios = ", ".join(f"{gt} {u['ratio']:.3f}" if u["ratio"] is not None else f"{gt} -" for gt, u in n["usage"].items())
        lines.append(f"{'  ' * depth + path.rsplit('/', 1)[-1]:<28} {n['share']:>6g} {n['fraction']:>9.3f}  {ratios}")
    if r.get("window_s") is not None:
        lines.append(f"(usage over the last {format_duration_s(r['window_s'])})")
    return _out(args, r, "\n".join(lines))


def _cmd_budget_set(args) -> int:
    shares: dict[str, float] = {}
    for path, share in args.shares:
        if path in shares:
            args.error(f"argument PATH=SHARE: {path!r} given twice")
        shares[path] = share
    r = _call(args, "PUT", "/v1/allocations", json={"shares": shares, "reason": args.reason})
    lines = [f"budget changed ({r['event_id']}):"]
    lines += [f"  {p}: {c['old']} -> {c['new']}" for p, c in r["changed"].items()]
    return _out(args, r, "\n".join(lines))


def _cmd_budget_remove(args) -> int:
    r = _call(args, "POST", "/v1/allocations/remove", json={"path": args.path, "reason": args.reason})
    return _out(args, r, f"removed {', '.join(r['removed'])} ({r['event_id']})")


def _cmd_token_new(args) -> int:
    """A fresh random token and its table entry (only the sha256 of the token is stored)."""
    import secrets

    from .common.auth import token_hash

    token = secrets.token_urlsafe(32)
    entry = {"user": args.user}
    if args.member_of:
        entry["member_of"] = args.member_of
    if args.manages:
        entry["manages"] = args.manages
    if args.admin:
        entry["admin"] = True
    key = token_hash(token)
    if args.add_to:
        try:
            with open(args.add_to) as fh:
                table = json.load(fh)
        except FileNotFoundError:
            table = {}
        table[key] = entry
        fd = os.open(args.add_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # readable by its owner only
        with os.fdopen(fd, "w") as fh:
            json.dump(table, fh, indent=2)
        print(f"added {args.user} to {args.add_to}", file=sys.stderr)
    else:
        print(json.dumps({key: entry}))
    print(f"token for {args.user} (shown once, keep it secret): {token}", file=sys.stderr)
    return 0


def _cmd_budget_history(args) -> int:
    params = {"limit": args.limit} | ({"before_seq": args.before} if args.before is not None else {})
    r = _call(args, "GET", "/v1/allocations/history", params=params)
    lines = []
    for h in r["changes"]:
        lines.append(f"{_utc(h['at_ms'])}  {h['by']}: {h['reason']}  " + ", ".join(
            _share_change(p, c) for p, c in h["changed"].items()))
    if r.get("older_before_seq") is not None:
        lines.append(f"(older changes: timeshare budget history --before {r['older_before_seq']})")
    return _out(args, r, "\n".join(lines) or "no budget changes yet")


def _share_change(path: str, change: dict) -> str:
    """One path of a budget change as the history prints it (a removed path's subtree went with it)."""
    if change["old"] is None:
        return f"{path} added ({change['new']})"
    if change["new"] is None:
        return f"{path} removed ({change['old']}; with everything below it)"
    return f"{path} {change['old']}->{change['new']}"


def _cmd_budget_report(args) -> int:
    start = args.start
    end = None if args.end == NOW else args.end
    if start == NOW:
        start = time.time()
    if start is not None and start >= (time.time() if end is None else end):
        args.error("argument --from: must be before --to")
    params = {k: v for k, v in (("from_s", start), ("to_s", end)) if v is not None}
    r = _call(args, "GET", "/v1/report", params=params)
    if args.json:
        return _out(args, r, "")
    # read with .get: the ledger's report is young, a field it stops sending shows as "-"
    span = "from the first event" if r.get("from_s") is None else _utc(r["from_s"] * 1000)
    to = None if r.get("to_s") is None else r["to_s"] * 1000
    lines = [f"GPU-hours owed and delivered, {span} to {_utc(to)} (owed = the share's GPU-hours the team asked for)",
             f"{'team':<28} {'fraction':>8} {'owed GPU-h':>11} {'delivered GPU-h':>16} {'attainment':>10}"]
    for team, t in (r.get("teams") or {}).items():
        lines.append(f"{team:<28} {_num(t.get('fraction'), '.3f'):>8} {_num(t.get('owed_gpu_hours'), '.2f'):>11} "
                     f"{_num(t.get('delivered_gpu_hours'), '.2f'):>16} {_pct(t.get('attainment')):>10}")
    a = r.get("attainment") or {}
    lines.append(f"fleet attainment {_pct(a.get('fleet'))}, lowest team {_pct(a.get('min_team'))}, "
                 f"{_num(a.get('teams_at_or_above_95'), 'g')} of {_num(a.get('teams'), 'g')} teams at or above 95%")
    reasons = ", ".join(f"{k} {v}" for k, v in (r.get("preemptions_by_reason") or {}).items())
    wait = r.get("queue_wait_s") or {}
    lines.append(f"occupancy {_pct(r.get('occupancy'))}, unallocated work {_pct(r.get('unallocated_share'))} of busy "
                 f"GPUs, {_num(r.get('preemptions'), 'g')} preemptions" + (f" ({reasons})" if reasons else "")
                 + (f", queue wait p50 {format_duration_s(wait['p50'])} p90 {format_duration_s(wait['p90'])} "
                    f"over {wait['count']} starts" if wait.get("count") and "p50" in wait and "p90" in wait else ""))
    if "waste" in r or "wasted_gpu_hours" in r:  # a ledger from before waste was reported sends neither
        w = r.get("waste") or {}
        lines.append(f"wasted {_num(r.get('wasted_gpu_hours'), '.2f')} GPU-h: lost progress "
                     f"{_num(w.get('lost_gpu_hours'), '.2f')}, checkpoints on notice "
                     f"{_num(w.get('checkpoint_gpu_hours'), '.2f')} "
                     f"({_num(w.get('per_1000_delivered_gpu_hours'), '.1f')} per 1,000 GPU-h delivered)")
    return _out(args, r, "\n".join(lines))


def add_parsers(sub) -> None:
    def common(p):
        p.add_argument("--url", help="gateway URL (default $TIMESHARE_URL, else the stack of make run, found in "
                                      ".run/devstack/env, else http://127.0.0.1:8080)")
        p.add_argument("--token", help="bearer token (default $TIMESHARE_TOKEN, else the devstack's with its URL)")
        p.add_argument("--json", action="store_true", help="print the gateway's JSON answer")
        p.set_defaults(error=p.error)
        return p

    p = common(sub.add_parser("submit", help="submit a workload to the live scheduler"))
    p.add_argument("--project", required=True)
    p.add_argument("--gpu-type", default="H100")
    p.add_argument("--gpus", type=_positive_int, required=True)
    p.add_argument("--work", type=_work, required=True, help="declared work time (e.g. 2h30m, 2hours, 90min)")
    p.add_argument("--min-runtime", type=_duration, default="0", help="protected minimum runtime (0 = unallocated)")
    p.add_argument("--resumable", action="store_true")
    p.add_argument("--checkpoint-every", type=_interval, metavar="DURATION",
                   help="resumable work: it keeps its progress at these intervals (e.g. 30min)")
    p.add_argument("--checkpoint-on-notice", type=_notice, metavar="DURATION",
                   help="time it needs to checkpoint after SIGTERM (e.g. 90s): a preemption gives it this notice "
                        "(at most the policy's max_notice, 5 min by default)")
    p.add_argument("--checkpoint-gb", type=_gigabytes, metavar="GB", help="size of that checkpoint")
    p.add_argument("--suspends-on-notice", action="store_true",
                   help="an interactive session that saves its state on notice and resumes it")
    p.add_argument("--priority", default="normal", choices=PRIORITIES)
    p.add_argument("--kind", default="other")
    p.add_argument("--idempotency-key")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the workload id (ID=$(timeshare submit ... -q))")
    p.add_argument("command", nargs="*", help="command for the process executor (after --)")
    p.set_defaults(func=_cmd_submit)
    for name, fn, helptext in (("status", _cmd_status, "a workload's state and history"),
                               ("explain", _cmd_explain, "why a workload waits, runs or was preempted"),
                               ("cancel", _cmd_cancel, "cancel a workload")):
        p = common(sub.add_parser(name, help=helptext))
        p.add_argument("id", type=_name)
        p.set_defaults(func=fn)
    p = common(sub.add_parser("trace", help="a workload's trace: the request, each decision about it (a "
                                            "preemption with its numbers), the executor's reports"))
    p.add_argument("id", type=_name)
    p.set_defaults(func=_cmd_trace)
    p = common(sub.add_parser("whoami", help="the user (and roles) of your token"))
    p.set_defaults(func=_cmd_whoami)
    p = common(sub.add_parser("workloads", help="workloads you may see (yours, and those of subtrees you "
                                                "manage), oldest first; --user's or --mine only"))
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", help="only this user's")
    who.add_argument("--mine", action="store_true", help="only your own (the token's user)")
    p.add_argument("--state", choices=STATES, help="only in this state; preempted = stopped by a preemption and "
                                                   "not run since (ended, or requeued and waiting)")
    p.add_argument("--preempted", action="store_true", help="only work preempted at least once, whatever its state")
    p.add_argument("--limit", type=_positive_int, default=200)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the workload ids, one a line")
    p.set_defaults(func=_cmd_workloads)
    p = common(sub.add_parser("queue", help="pending work in scheduling order"))
    p.add_argument("--gpu-type")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", help="only this user's workloads (their positions in the whole queue)")
    who.add_argument("--mine", action="store_true", help="only your own (the token's user)")
    p.add_argument("--project", help="only workloads of this project or below it, e.g. tulu or tulu/rl")
    p.add_argument("--limit", type=_positive_int, default=50)
    p.set_defaults(func=_cmd_queue)
    p = common(sub.add_parser("nodes", help="nodes, their state and work (nodes cordon / uncordon / repair NODE)"))
    p.set_defaults(func=_cmd_nodes)
    nsub = p.add_subparsers(dest="nodes_command", metavar="{cordon,uncordon,repair}")
    r = common(nsub.add_parser("cordon", help="take a node out of service (admins, health agents): no new work, "
                                              "drained as its work reaches its minimum runtime, then repaired"))
    r.add_argument("node", type=_name)
    r.add_argument("--reason", required=True, help="why (kept on the node.unhealthy event)")
    r.add_argument("--needs-human", action="store_true", help="a person must repair it (no repair command)")
    r.set_defaults(func=_cmd_nodes_cordon)
    r = common(nsub.add_parser("uncordon", help="take back a cordon (admins): a cordoned or drained node takes work "
                                                "again at once"))
    r.add_argument("node", type=_name)
    r.set_defaults(func=_cmd_nodes_uncordon)
    r = common(nsub.add_parser("repair", help="declare a drained or failed node repaired (admins)"))
    r.add_argument("node", type=_name)
    r.set_defaults(func=_cmd_nodes_repair)
    budget = sub.add_parser("budget", help="the allocation tree (show / set / remove / history / report)")
    bsub = budget.add_subparsers(dest="budget_command", required=True, metavar="{show,set,remove,history,report}")
    p = common(bsub.add_parser("show", help="shares, fractions and usage ratios"))
    p.set_defaults(func=_cmd_budget_show)
    p = common(bsub.add_parser("set", help="change shares: path=share ..."))
    p.add_argument("shares", nargs="+", type=_share, metavar="PATH=SHARE")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=_cmd_budget_set)
    p = common(bsub.add_parser("remove", help="retire a node that holds no pending or running work"))
    p.add_argument("path", help="the node (and its subtree) to retire, e.g. tulu/old-team")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=_cmd_budget_remove)
    p = common(bsub.add_parser("history", help="the audit log of budget changes (the newest first in a page)"))
    p.add_argument("--limit", type=int, default=100, choices=range(1, 1001), metavar="N",
                   help="changes per page, 1-1000 (default 100)")
    p.add_argument("--before", type=int, metavar="SEQ", help="the page before this change (as the last line says)")
    p.set_defaults(func=_cmd_budget_history)
    p = common(bsub.add_parser("report", help="GPU-hours owed / delivered and attainment per team (the ledger)"))
    p.add_argument("--from", dest="start", type=_when, default=None, metavar="WHEN",
                   help="start: a duration ago (2d, 12 hours), a UTC date/time (2026-12-01 14:00) or now "
                        "(default: the first event)")
    p.add_argument("--to", dest="end", type=_when, default=NOW, metavar="WHEN", help="end (default: now)")
    p.set_defaults(func=_cmd_budget_report)
    token = sub.add_parser("token", help="gateway tokens (new: a random token and its hashed table entry)")
    tsub = token.add_subparsers(dest="token_command", required=True, metavar="{new}")
    p = tsub.add_parser("new", help="print a new token (once) and its entry {\"sha256:...\": {...}}")
    p.add_argument("--user", required=True)
    p.add_argument("--member-of", action="append", default=[], metavar="LEAF", help="may submit to this leaf or subtree")
    p.add_argument("--manages", action="append", default=[], metavar="PATH", help="manages this subtree")
    p.add_argument("--admin", action="store_true")
    p.add_argument("--add-to", metavar="FILE", help="add the entry to this token file (created 0600)")
    p.set_defaults(func=_cmd_token_new)
