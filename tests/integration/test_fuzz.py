"""schemathesis over the gateway's whole OpenAPI document, against the live stack (real NATS,
PostgreSQL and every service), with a user's, a manager's and an admin's token.

Every operation gets ``TIMESHARE_FUZZ_EXAMPLES`` generated requests per token (default 15, so
CI stays within a minute or two), valid and invalid ones (schemathesis' positive and negative
modes). Checked for every response: no 5xx, the status code and content type documented, the
body matching its schema; and for every refusal (4xx) nothing was proposed to placement (the
inbox's counts of gateway, budget and health proposals are the same before and after). The
counts tried are printed at the end of the session (tests/conftest.py).

The fuzzing client runs in its own process (``python -m tests.integration.test_fuzz``): in a
thread of the test's process its data generation held the GIL long enough to starve the
services' event loop (placement's lease lapsed, and a lapsed lease is not what this looks for).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from services.common import subjects
from services.devstack.stack import Stack

from .helpers import client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("TIMESHARE_FUZZ_EXAMPLES", "15"))
TOKENS = {"user": "tok-carol", "manager": "tok-alice", "admin": "tok-admin"}
#: what the fuzz tried, printed in the session summary
TRIED: dict[str, int] = {}


async def test_schemathesis_over_every_operation_with_three_roles(make_settings):
    stack = await Stack(make_settings(lease_ttl_s=10.0)).start()
    try:
        gw = stack["gateway"]
        # something to find: a running workload of carol's
        async with client(stack, "tok-carol") as carol:
            r = await carol.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                        "work_s": 600, "id": "seed"})
            assert r.status_code == 202
        work = Path(os.environ.get("TMPDIR", "/tmp")) / f"fuzz-{stack.settings.cluster}.json"
        work.write_text(json.dumps(gw.app.openapi()))
        args = {"openapi": str(work), "url": gw.url, "tokens": TOKENS, "examples": EXAMPLES,
                "settings": {"nats_url": stack.settings.nats_url, "nats_credentials": stack.settings.nats_credentials,
                             "cluster": stack.settings.cluster, "cluster_file": stack.settings.cluster_file}}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.integration.test_fuzz", json.dumps(args), cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 600)
        work.unlink(missing_ok=True)
        assert proc.returncode == 0, err.decode()[-3000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        await stack.stop()
    counts, failures = result["counts"], result["failures"]
    TRIED["schemathesis requests"] = counts["requests"]
    TRIED.update({f"schemathesis {k}": v for k, v in counts.items() if k != "requests"})
    assert counts.get("5xx", 0) == 0 and not failures, "\n".join(failures[:30])
    assert counts["operations"] >= 15 and counts["requests"] >= counts["operations"] * len(TOKENS)


# -- the fuzzing client (its own process) ----------------------------------------------------
def _client(args: dict) -> dict:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                                   status_code_conformance)

    from services.common.bus import Bus
    from services.common.settings import Settings

    loop = asyncio.new_event_loop()
    cluster = args["settings"]["cluster"]
    bus = loop.run_until_complete(Bus.connect(Settings(**args["settings"]), cluster, name="fuzz", role="operator"))

    def proposals() -> dict[str, int]:
        """Messages per inbox subject, except the executor's reports (they arrive on their own time)."""
        info = loop.run_until_complete(bus.js.stream_info(subjects.INBOX_STREAM,
                                                          subjects_filter=subjects.inbox_filter(cluster)))
        return {s: n for s, n in (info.state.subjects or {}).items()
                if not s.endswith(("workload.completed", "workload.failed"))}

    schema = schemathesis.openapi.from_dict(json.loads(Path(args["openapi"]).read_text()))
    operations = [result.ok() for result in schema.get_all_operations()]
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    failures: list[str] = []
    counts = {"requests": 0, "operations": len(operations), "2xx": 0, "4xx": 0, "5xx": 0}

    def fuzz_one(op, role: str, token: str) -> None:
        strategy = op.as_strategy(generation_mode=GenerationMode.POSITIVE) | op.as_strategy(
            generation_mode=GenerationMode.NEGATIVE)

        @settings(max_examples=args["examples"], deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case) -> None:
            before = proposals()
            headers = {"Authorization": f"Bearer {token}"}
            response = case.call(base_url=args["url"], headers=headers, timeout=30)
            for _ in range(3):
                # 503 is the gateway's "a service did not answer, retry" (placement between
                # terms on a loaded machine): retried as a client would; still 503 is a failure
                if response.status_code != 503:
                    break
                counts["503 retried"] = counts.get("503 retried", 0) + 1
                time.sleep(2)
                response = case.call(base_url=args["url"], headers=headers, timeout=30)
            counts["requests"] += 1
            kind = f"{response.status_code // 100}xx"
            counts[kind] = counts.get(kind, 0) + 1
            try:
                case.validate_response(response, checks=checks, headers=headers)
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collected, reported together
                failures.append(f"{role} {op.label} -> {response.status_code}: {str(exc)[:400]}")
            if 400 <= response.status_code < 500:
                after = proposals()
                if after != before:
                    changed = {s: after[s] - before.get(s, 0) for s in after if after[s] != before.get(s)}
                    failures.append(f"{role} {op.label} -> {response.status_code} yet proposed {changed}")

        run()

    try:
        for op in operations:
            for role, token in args["tokens"].items():
                fuzz_one(op, role, token)
    finally:
        loop.run_until_complete(bus.close())
    return {"counts": counts, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(_client(json.loads(sys.argv[1]))))
