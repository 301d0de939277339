"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a running
stack: each page shows what it should, nothing is loaded from another host, screenshots kept.

Screenshots go to ``$TIMESHARE_SCREENSHOTS`` when set (``make screenshots`` sets it to
``docs/screenshots``), else to the test's temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from timeshare import events as ev

from .helpers import client, of_type, wait_events, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("TIMESHARE_CHROMIUM", "/usr/bin/chromium")
# headless in a container, as root: no sandbox, no GPU, no calls home
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]


@pytest.fixture
def screenshots(tmp_path) -> Path:
    out = Path(os.environ.get("TIMESHARE_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
async def browser():
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (.ci/run does)")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        await b.close()


async def _scenario(stack) -> str:
    """alpha fills both nodes with resumable work protected for 2 s; beta, which used nothing,
    preempts one; the victim waits in the queue. Returns the victim's id."""
    cluster, bus = stack.settings.cluster, stack["gateway"].bus
    async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
        for i in range(2):
            r = await alice.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 4,
                                                         "work_s": 600, "min_runtime_s": 2, "resumable": True,
                                                         "id": f"hog-{i}"})
            assert r.status_code == 202, r.text
        await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
        r = await bob.post("/v1/workloads", json={"project": "beta/debug", "gpu_type": "H100", "gpus": 4,
                                                   "work_s": 600, "min_runtime_s": 600, "id": "newcomer"})
        assert r.status_code == 202
        events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "newcomer"),
                                   timeout_s=15, what="the newcomer to start")
        victim = of_type(events, ev.WorkloadPreempted)[0].workload_id

        async def settled():  # the gateway's projection shows the victim back in the queue
            doc = (await alice.get(f"/v1/workloads/{victim}")).json()
            return doc["state"] == "pending" and doc["last_reason"]

        await wait_for(settled, 10, what="the victim pending in the gateway")
    return victim


async def _open(page, url: str, shot: Path) -> str:
    await page.goto(url)
    await page.wait_for_selector("body[data-ready]", state="attached", timeout=15_000)
    assert await page.get_attribute("body", "data-ready") == "1", await page.inner_text("main")
    await page.screenshot(path=str(shot), full_page=True)
    # at the default width the page does not scroll sideways
    widths = await page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], (url, widths)
    return await page.inner_text("main")


#: WCAG's contrast of two computed CSS colours ("rgb(r, g, b)"), 1 to 21
CONTRAST_JS = """([a, b]) => {
  const lum = (css) => { const [r, g, b] = css.match(/[\\d.]+/g).slice(0, 3).map((x) => Number(x) / 255)
    .map((c) => c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
  return (x + 0.05) / (y + 0.05);
}"""


async def test_every_page_renders_the_live_state_from_local_assets_only(make_settings, browser, screenshots):
    from services.devstack.stack import Stack

    stack = await Stack(make_settings(otel="memory")).start()
    try:
        await _pages(stack, browser, screenshots)
    finally:
        await stack.stop()


async def _pages(stack, browser, screenshots: Path) -> None:
    victim = await _scenario(stack)
    base = stack["gateway"].url
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    outside: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith((base, "data:", "blob:")) else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    # without a token the page says how to give one
    await page.goto(f"{base}/ui")
    assert "bearer token" in (await page.inner_text("#status"))

    # the allocation tree: every node with its fraction, owed vs delivered and the ratio
    text = await _open(page, f"{base}/ui#token=tok-alice", screenshots / "tree.png")
    assert "#token" not in page.url  # the token left the address bar
    rows = page.locator("#tree tbody tr")
    assert [await r.get_attribute("data-path") for r in await rows.all()] == ["alpha", "alpha/train", "beta",
                                                                              "beta/debug"]
    alpha_train = await page.inner_text('#tree tr[data-path="alpha/train"]')
    assert "50.0%" in alpha_train  # fraction: 1/2 x 1/1
    assert "×" in alpha_train      # its usage ratio
    # a young window's tiny ratio reads "<0.01×", not "0.000028×"
    ratio_cells = await page.locator('#tree td[title^="allocated GPU-s used in the window"]').all_inner_texts()
    assert ratio_cells and all(re.fullmatch(r"–|<0\.01×|\d+\.\d\d×", t) for t in ratio_cells), ratio_cells
    assert "funded attainment" in text and "preemptions" in text
    # what the preemptions wasted, as the ledger's report says (the victim lost its progress)
    async with client(stack, "tok-alice") as alice:
        report = (await alice.get("/v1/report")).json()
    waste = await page.inner_text("#waste")
    assert report["waste"]["lost_gpu_hours"] > 0, report
    assert waste.startswith(f"{report['wasted_gpu_hours']:.2f}") and \
        f"lost progress {report['waste']['lost_gpu_hours']:.2f}, checkpoints on notice " \
        f"{report['waste']['checkpoint_gpu_hours']:.2f}" in waste, waste
    assert await page.inner_text("#whoami") == "alice"
    # delivered vs owed over time: one bar per hour the ledger's series has, the axis named
    async with client(stack, "tok-alice") as alice:
        series = (await alice.get("/v1/report/series")).json()
        assert series["bucket_s"] == 3600 and series["buckets"], series
        assert sum(b["owed_gpu_hours"] for b in series["buckets"]) > 0
        team = (await alice.get("/v1/report/series", params={"node": "alpha/train"})).json()
        refused = {"unknown node": (await alice.get("/v1/report/series", params={"node": "gamma"})),
                   "to before from": (await alice.get("/v1/report/series", params={"from_s": 100, "to_s": 50})),
                   "no hours": (await alice.get("/v1/report/series", params={"bucket_h": 0}))}
    assert {k: r.status_code for k, r in refused.items()} == {"unknown node": 404, "to before from": 400,
                                                              "no hours": 422}
    assert "gamma" in refused["unknown node"].json()["detail"]
    assert await page.locator("#series rect.delivered").count() == len(series["buckets"])
    assert await page.locator("#series line.owed").count() == len(series["buckets"])
    assert await page.get_attribute("#series", "data-points") == str(len(series["buckets"]))
    assert await page.text_content("#y-label") == "GPU-hours per hour"
    assert (await page.text_content("#x-label")).startswith("time (UTC)")
    # another tree node: chosen in the select, kept in the address
    await page.select_option("#chart-node", "alpha/train")
    await page.wait_for_url("**node=alpha%2Ftrain**")
    await page.wait_for_selector("body[data-ready]", state="attached", timeout=15_000)
    await page.wait_for_selector("#series rect.delivered", timeout=15_000)
    assert await page.input_value("#chart-node") == "alpha/train"
    assert await page.locator("#series rect.delivered").count() == len(team["buckets"])
    title = await page.locator("#series rect.delivered title").first.text_content()
    assert f"delivered {team['buckets'][0]['delivered_gpu_hours']:.2f}" in title, title
    await page.locator("#series").screenshot(path=str(screenshots / "tree-chart.png"))

    # the queue: the victim, first, with its ordering key per level
    text = await _open(page, f"{base}/ui/queue", screenshots / "queue.png")
    row = page.locator(f'#queue tr[data-workload="{victim}"]')
    assert await row.count() == 1
    cells = await row.locator("td").all_inner_texts()
    assert cells[0] == "1" and cells[2] == "alpha/train" and cells[5] == "allocated"
    assert "alpha: fill" in cells[8] and "alpha/train: fill" in cells[8]
    # the waits of the three starts so far (two hogs, the newcomer), from the metrics
    waits = [await r.locator("td").all_inner_texts() for r in await page.locator("#waits tbody tr").all()]
    assert sum(int(w[2]) for w in waits) == 3 and {w[1] for w in waits} == {"allocated"}

    # the cluster: one row per node, each GPU coloured by team; beta's newcomer protected,
    # alpha's remaining hog past its minimum runtime (preemptible)
    await _open(page, f"{base}/ui/cluster", screenshots / "cluster.png")
    assert await page.locator(".node-row").count() == 2
    newcomer = page.locator('.gpu[data-workload="newcomer"]')
    assert await newcomer.count() == 4
    classes = [await g.get_attribute("class") for g in await newcomer.all()]
    assert all("protected" in c.split() for c in classes), classes
    other = "hog-1" if victim == "hog-0" else "hog-0"
    hog = page.locator(f'.gpu[data-workload="{other}"]')
    assert await hog.count() == 4
    classes = [await g.get_attribute("class") for g in await hog.all()]
    assert all("preemptible" in c.split() for c in classes), classes
    colour = lambda loc: loc.first.evaluate("e => getComputedStyle(e).backgroundColor")  # noqa: E731
    assert await colour(newcomer) != await colour(hog)  # another program, another hue
    assert await page.locator('.legend [data-team="beta/debug"]').count() == 1
    # readable cells: every label fits its cell, its text contrasts with the team's colour at
    # least 4.5:1 (hatched cells too: the hatching is a band below the text), and the GPUs use
    # the row's width
    for cell in await page.locator(".gpu[data-workload]").all():
        fits = await cell.evaluate("e => [...e.querySelectorAll('.gpu-label')].every((l) => l.scrollWidth <= l.clientWidth)")
        assert fits, await cell.inner_text()
        ink, ground = await cell.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
        assert await page.evaluate(CONTRAST_JS, [ink, ground]) >= 4.5, (await cell.get_attribute("data-project"), ink, ground)
    row = await page.locator(".node-row").first.bounding_box()
    last = await page.locator(".node-row").first.locator(".gpu").last.bounding_box()
    main = await page.locator("main").bounding_box()
    assert last["x"] + last["width"] >= row["x"] + 0.95 * row["width"] and row["width"] >= 0.9 * (main["width"] - 40)
    # the demo's five teams under two programs: no two alike (the two oranges were)
    swatches = await page.evaluate("""() => Object.entries(teamColours(["product/eval", "product/serving", "research/llm",
        "research/rl", "research/vision"])).filter(([path]) => path.includes("/")).map(([, c]) => { const e = document.createElement("i"); e.style.color = c;
        document.body.append(e); const rgb = getComputedStyle(e).color.match(/\\d+/g).map(Number); e.remove(); return rgb; })""")
    far = min(sum((a - b) ** 2 for a, b in zip(p, q)) ** 0.5 for i, p in enumerate(swatches) for q in swatches[i + 1:])
    assert far >= 45, swatches

    # the workload page: state, why, the preemption's numbers, timeline and trace
    text = await _open(page, f"{base}/ui/workloads/{victim}", screenshots / "workload.png")
    assert await page.inner_text("#state") == "pending"
    # why, in short paragraphs: now, then the last stop; the spared candidates are the table below
    paragraphs = await page.locator("#explanation p").all_inner_texts()
    assert len(paragraphs) == 2 and paragraphs[1].startswith("Last stopped"), paragraphs
    assert "considered and spared" not in " ".join(paragraphs) and max(map(len, paragraphs)) < 400, paragraphs
    reason = await page.inner_text("#reason")
    assert "fair_share" in reason and "newcomer" in reason and "top of the tree" in reason
    ratios = await page.locator('#reason tr[data-field="preemptor_ratio / victim_ratio"] td').all_inner_texts()
    assert len(ratios) == 2 and float(ratios[0]) < float(ratios[1])  # the victim's side used more
    # the candidates the decision spared, one row each, as the reason holds them (the other hog)
    async with client(stack, "tok-alice") as alice:
        spared = (await alice.get(f"/v1/workloads/{victim}")).json()["last_reason"]["rejected"]
    assert spared and {c["workload_id"] for c in spared} == {"hog-0", "hog-1"} - {victim}
    rows = page.locator("#spared tbody tr")
    assert [await r.get_attribute("data-workload") for r in await rows.all()] == [c["workload_id"] for c in spared]
    assert [await r.get_attribute("data-reason") for r in await rows.all()] == [c["reason"] for c in spared]
    assert spared[0]["message"] in await rows.first.inner_text()
    history = [await r.get_attribute("data-event") for r in await page.locator("#history tbody tr").all()]
    assert history[:2] == ["workload.submitted", "workload.started"] and "workload.preempted" in history
    assert await page.locator("#timeline .mark").count() == 1  # one preemption, one red mark
    mark = await page.locator("#timeline .mark").bounding_box()
    assert mark["width"] >= 4 and mark["height"] >= 34, mark  # a bar across the timeline, not a 1-px tick
    # the trace as a waterfall: the HTTP request, the submission, each decision about it
    spans = [await s.get_attribute("data-span") for s in await page.locator("#trace [data-span]").all()]
    assert spans[0] == "POST /v1/workloads", spans
    for name in ("placement workload.submitted", "placement.pass workload.started",
                 "placement.pass workload.preempted", "placement.pass workload.requeued"):
        assert name in spans, (name, spans)

    # a bad id is refused with the reason, not rendered
    r = await page.goto(f"{base}/ui/workloads/{'x' * 300}")
    assert r.status == 400

    # /docs and /redoc render offline
    await page.goto(f"{base}/docs")
    await page.get_by_text("/v1/workloads/{workload_id}/explain").wait_for(timeout=15_000)
    assert await page.get_by_role("button", name="Authorize").count() >= 1  # a token for "Try it out"
    await page.screenshot(path=str(screenshots / "docs.png"))
    assert not outside, outside
    scripts: list[str] = []
    page.on("request", lambda r: scripts.append(r.url)
            if r.resource_type in ("script", "stylesheet", "font", "fetch", "xhr") and not r.url.startswith(
                (base, "data:", "blob:")) else None)
    await page.goto(f"{base}/redoc")
    await page.get_by_text("timeshare gateway").first.wait_for(timeout=15_000)
    # ReDoc's footer logo is an <img> from its makers' host: it fails offline, nothing else does
    assert not scripts, scripts
    assert not errors, errors


async def test_the_cluster_view_marks_gpus_under_notice_and_explain_says_until_when(make_settings, browser,
                                                                                   screenshots):
    """alpha runs a protected gang on one node and, on the other, a 2-GPU job with a 30-s notice;
    beta's 4-GPU request takes that node: the job's GPUs are marked under notice (free by the
    deadline), the node's 2 free GPUs held for beta's request, and explain says so on both sides."""
    from services.devstack.stack import Stack

    stack = await Stack(make_settings()).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            for wid, gpus, body in (("gang", 4, {"min_runtime_s": 600}),
                                    ("noticed", 2, {"min_runtime_s": 2, "checkpoint_on_notice_s": 30})):
                r = await alice.post("/v1/workloads", json={
                    "project": "alpha/train", "gpu_type": "H100", "gpus": gpus, "work_s": 600, "resumable": True,
                    "checkpoint_interval_s": 60, "id": wid, **body})
                assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
            nodes = {e.workload_id: e.placement[0].node for e in of_type(events, ev.WorkloadStarted)}
            assert nodes["gang"] != nodes["noticed"]
            await wait_for(lambda: _past_protection(alice, "noticed"), 10, what="past its minimum runtime")
            r = await bob.post("/v1/workloads", json={"project": "beta/debug", "gpu_type": "H100", "gpus": 4,
                                                       "work_s": 600, "min_runtime_s": 600, "id": "newcomer"})
            assert r.status_code == 202
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadPreemptionNotice),
                                       timeout_s=15, what="a notice")
            notice = of_type(events, ev.WorkloadPreemptionNotice)[0]
            assert notice.workload_id == "noticed" and notice.reason.by_workload_id == "newcomer"
            assert notice.deadline_ms == notice.at_ms + 30_000 and notice.preemptor_nodes == [nodes["noticed"]]
            await wait_for(lambda: _has_notice(alice, "noticed"), 10, what="the notice in the gateway")
            said = (await alice.get("/v1/workloads/noticed/explain")).json()["summary"]
            assert said.startswith("Preempted with notice: notified at ") and "checkpointing, GPUs free for newcomer by" \
                in said, said
            said = (await bob.get("/v1/workloads/newcomer/explain")).json()["summary"]
            assert said.startswith("Waiting for the GPUs of noticed under notice"), said
        page = await browser.new_page()
        await page.goto(f"{stack['gateway'].url}/ui#token=tok-admin")
        await _open(page, f"{stack['gateway'].url}/ui/cluster", screenshots / "cluster-notice.png")
        row = page.locator(f'.node-row[data-node="{nodes["noticed"]}"]')
        marked = row.locator(".gpu.notice[data-workload]")
        assert await marked.count() == 2
        assert {await g.get_attribute("data-workload") for g in await marked.all()} == {"noticed"}
        assert {await g.get_attribute("data-held-for") for g in await marked.all()} == {"newcomer"}
        assert {await g.get_attribute("data-notice-deadline") for g in await marked.all()} == {str(notice.deadline_ms)}
        assert "under notice since" in await marked.first.get_attribute("title")
        held = row.locator(".gpu.free.held")
        assert await held.count() == 2  # the node's free GPUs, kept for the newcomer meanwhile
        assert {await g.get_attribute("data-held-for") for g in await held.all()} == {"newcomer"}
        assert await page.locator("#cluster .gpu.notice").count() == 2  # nothing else is under notice
        assert await page.locator("#cluster .gpu.held").count() == 2
        assert "under notice" in await page.locator("#legend-notice").inner_text()
        assert "held for a preemptor" in await page.locator("#legend-held").inner_text()
        await page.close()
    finally:
        await stack.stop()


async def _past_protection(http, wid: str) -> bool:
    doc = (await http.get(f"/v1/workloads/{wid}")).json()
    return doc.get("last_event") == "workload.min_runtime_reached"


async def _has_notice(http, wid: str) -> bool:
    return bool((await http.get(f"/v1/workloads/{wid}")).json().get("notice"))
