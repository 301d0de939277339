"""Screenshots of a running gateway's dashboard (the README's pictures of the demo cluster).

    make run                                   # in one terminal; prints the gateway URL
    python -m services.devstack.screenshots http://127.0.0.1:8080 --token dev-admin --out docs/screenshots

Drives Debian's chromium with Playwright (``--chromium``); writes ``demo-tree.png``,
``demo-queue.png``, ``demo-cluster.png`` and ``demo-workload.png`` (the most preempted workload
still known, else the first running one). The browser tests keep their own screenshots
(``make screenshots``).

A page fills itself from the API after it loads: a screenshot taken at the load event (a bare
``chromium --headless --screenshot URL``) shows "loading...". Wait for ``body[data-ready]``, as
this script does (``data-ready="1"``: drawn; other values: the error it shows).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import httpx

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]


async def shoot(url: str, token: str, out: Path, chromium: str) -> list[Path]:
    from playwright.async_api import async_playwright

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        r = await http.get("/v1/workloads", params={"limit": 10000})
        r.raise_for_status()
        rows = r.json()["workloads"]
    rows.sort(key=lambda w: (-w["preemptions"], w["state"] != "running", w["submitted_ms"]))
    pages = [("tree", f"/ui#token={token}"), ("queue", "/ui/queue"), ("cluster", "/ui/cluster")]
    if rows:
        pages.append(("workload", f"/ui/workloads/{rows[0]['id']}"))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        for name, path in pages:
            await page.goto(url + path)
            await page.wait_for_selector("body[data-ready]", state="attached", timeout=20_000)
            target = out / f"demo-{name}.png"
            # long pages (a busy queue, a much-preempted workload) as the first screenful only
            await page.screenshot(path=str(target), full_page=name in ("tree", "cluster"))
            written.append(target)
        await browser.close()
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.devstack.screenshots", description=__doc__.split("\n")[0])
    parser.add_argument("url", help="the gateway, e.g. http://127.0.0.1:8080")
    parser.add_argument("--token", default="dev-admin")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    for path in asyncio.run(shoot(args.url.rstrip("/"), args.token, args.out, args.chromium)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
