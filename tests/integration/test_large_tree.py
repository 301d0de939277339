"""A tree of thousands of projects through the real stack (NATS, PostgreSQL): its replies are
larger than NATS's 1 MB message limit, so they travel compressed (services/common/payload.py).

Before, placement's ``tree`` and ``work`` replies were refused by the NATS client
(``MaxPayloadError``): ``GET /v1/allocations`` got no answer and every budget change was a 503
("placement did not say which leaves hold work"). ``make bench-tree-live`` measures 10,000 leaves.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from services.common import payload

pytestmark = pytest.mark.integration

FANOUT = (6, 10, 100)  # 6,000 leaves in 3 levels: a tree reply of about 1.3 MB of JSON


def cluster_file(path) -> str:
    lines = ['name = "big"', "[policy]", 'lookback_window = "1h"', 'max_min_runtime = "1h"',
             "[[pools]]", 'gpu_type = "H100"', "nodes = 4", "gpus_per_node = 8", "[allocations]"]
    for a in range(FANOUT[0]):
        lines.append(f'"org{a}" = 1')
        for b in range(FANOUT[1]):
            lines.append(f'"org{a}/group{b:02d}" = 1')
            lines += [f'"org{a}/group{b:02d}/project{c:03d}" = 1' for c in range(FANOUT[2])]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def test_a_tree_whose_replies_exceed_the_message_limit_is_served_and_changed(make_settings, tmp_path):
    from services.devstack.stack import Stack

    settings = make_settings(cluster_file=cluster_file(tmp_path / "big.toml"))
    stack = await Stack(settings).start()
    try:
        admin = {"Authorization": "Bearer tok-admin"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.http_port}", timeout=30) as http:
            r = await http.get("/v1/allocations", headers=admin)
            assert r.status_code == 200, r.text
            assert len(r.content) > 1024 * 1024  # larger than one NATS message may be
            assert "org5/group09/project099" in r.text

            new = {f"org0/group00/added{i:03d}": 1.0 for i in range(500)}
            r = await http.put("/v1/allocations", json={"shares": new, "reason": "500 new projects"}, headers=admin)
            assert r.status_code == 200, r.text
            for _ in range(100):
                r = await http.get("/v1/allocations", headers=admin)
                if "org0/group00/added499" in r.text:
                    break
                await asyncio.sleep(0.1)  # the change is applied once placement reads it from the log
            assert "org0/group00/added499" in r.text
    finally:
        await stack.stop()


def test_small_replies_stay_plain_json_and_large_ones_round_trip_compressed():
    class Msg:
        def __init__(self, response):
            self.data, self.headers = response.body, response.headers

    small = {"a": 1}
    r = payload.answer(small)
    assert payload.HEADER not in (r.headers or {}) and r.body == b'{"a":1}'
    assert payload.decode(Msg(r)) == small
    big = {f"org/{i:05d}": {"share": 1.0, "usage": i} for i in range(20_000)}
    r = payload.answer(big)
    assert r.headers[payload.HEADER] == "zlib" and len(r.body) < payload.COMPRESS_ABOVE_BYTES
    assert payload.decode(Msg(r)) == big
    assert payload.decode_value(payload.value(big)) == big and payload.decode_value(payload.value(small)) == small
