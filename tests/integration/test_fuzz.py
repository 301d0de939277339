"""schemathesis over the gateway's whole OpenAPI document, against the live stack (real NATS,
PostgreSQL and every service), with a user's, a manager's and an admin's token.

Every operation gets ``TIMESHARE_FUZZ_EXAMPLES`` generated requests per token (default 15, so
CI stays within a minute or two), valid and invalid ones (schemathesis' positive and negative
modes). Checked for every response: no 5xx, the status code and content type documented, the
body matching its schema; and for every refusal (4xx) nothing was proposed to placement (the
inbox's counts of gateway, budget and health proposals are the same before and after). The
counts tried are printed at the end of the session (tests/integration/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from services.common import subjects
from services.devstack.stack import Stack

from .helpers import client

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("TIMESHARE_FUZZ_EXAMPLES", "15"))
TOKENS = {"user": "tok-carol", "manager": "tok-alice", "admin": "tok-admin"}
#: what the fuzz tried, printed in the session summary
TRIED: dict[str, int] = {}


async def _proposals(bus, cluster: str) -> dict[str, int]:
    """Messages per inbox subject, except the executor's reports (they arrive on their own time)."""
    info = await bus.js.stream_info(subjects.INBOX_STREAM, subjects_filter=subjects.inbox_filter(cluster))
    return {s: n for s, n in (info.state.subjects or {}).items()
            if not s.endswith(("workload.completed", "workload.failed"))}


async def test_schemathesis_over_every_operation_with_three_roles(make_settings):
    # a longer lease than the other tests': the fuzz thread competes for the GIL with the
    # services' event loop, and a lapsed lease (a healthy 503 while a new term starts) is not
    # what this test looks for
    stack = await Stack(make_settings(lease_ttl_s=10.0)).start()
    try:
        await _fuzz(stack)
    finally:
        await stack.stop()


async def _fuzz(stack) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                                   status_code_conformance)

    gw = stack["gateway"]
    cluster = stack.settings.cluster
    loop = asyncio.get_running_loop()
    # something to find: a running workload of carol's and a node
    async with client(stack, "tok-carol") as carol:
        r = await carol.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                    "work_s": 600, "id": "seed"})
        assert r.status_code == 202
    schema = schemathesis.openapi.from_dict(gw.app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    failures: list[str] = []
    counts = {"requests": 0, "4xx": 0, "2xx": 0, "5xx": 0, "operations": len(operations)}
    lock = threading.Lock()

    def proposals() -> dict[str, int]:
        return asyncio.run_coroutine_threadsafe(_proposals(gw.bus, cluster), loop).result(10)

    def fuzz_one(op, role: str, token: str) -> None:
        strategy = op.as_strategy(generation_mode=GenerationMode.POSITIVE) | op.as_strategy(
            generation_mode=GenerationMode.NEGATIVE)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case) -> None:
            before = proposals()
            headers = {"Authorization": f"Bearer {token}"}
            response = case.call(base_url=gw.url, headers=headers, timeout=30)
            with lock:
                counts["requests"] += 1
                counts[f"{response.status_code // 100}xx"] = counts.get(f"{response.status_code // 100}xx", 0) + 1
            try:
                case.validate_response(response, checks=checks, headers=headers)
            except Exception as exc:  # noqa: BLE001 - collected, reported together below
                failures.append(f"{role} {op.label} -> {response.status_code}: {str(exc)[:400]}")
            if 400 <= response.status_code < 500:
                after = proposals()
                if after != before:
                    failures.append(f"{role} {op.label} -> {response.status_code} yet proposed "
                                    f"{ {s: after[s] - before.get(s, 0) for s in after if after[s] != before.get(s)} }")

        run()

    def fuzz_all() -> None:
        for op in operations:
            for role, token in TOKENS.items():
                fuzz_one(op, role, token)

    await asyncio.to_thread(fuzz_all)
    TRIED["schemathesis"] = counts["requests"]
    TRIED.update({f"schemathesis {k}": v for k, v in counts.items() if k != "requests"})
    assert counts["5xx"] == 0 and not failures, "\n".join(failures[:30])
    assert counts["requests"] >= len(operations) * len(TOKENS)
