"""The pages a person opens, in a real headless Chromium (the Debian package, driven by
Playwright) against a running `bettercompute serve` on the demo fleet, with every request
beyond this machine refused: the live console shows the demo pools and a REST update
appears within a second; GraphiQL renders from the service's own assets. Screenshots go
to test-artifacts/ (console.png, graphiql.png)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.databases import service_unavailable
from tests.test_cli import BIN, _free_port, out

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """`bettercompute demo` then `serve` on a SQLite file: (base URL, demo's output)."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('browser')}/demo.db"
    seeded = out(url, "demo")
    port = _free_port()
    server = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port)],
        env={**os.environ, "BETTERCOMPUTE_DATABASE_URL": url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base, seeded
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        service_unavailable("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def offline_page(browser: Any, base: str) -> tuple[Any, list[str]]:
    """A page that may reach only the server under test; what else it asked for is kept."""
    context = browser.new_context(viewport={"width": 1400, "height": 800})
    blocked: list[str] = []

    def route(route: Any) -> None:
        if route.request.url.startswith(base) or route.request.url.startswith("data:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", route)
    return context.new_page(), blocked


def test_console_shows_the_pools_and_follows_a_rest_update_live(
    demo: tuple[str, dict[str, Any]], browser: Any
) -> None:
    base, seeded = demo
    token = seeded["tokens"]["acme-admin"]
    pool_id = seeded["pools"]["h100"]
    page, blocked = offline_page(browser, base)
    page.goto(f"{base}/console")
    page.fill("#token", token)
    page.fill("#tenant", "acme")
    page.click("button[type=submit]")
    row = page.locator(f"tr[data-pool-id='{pool_id}']")
    row.wait_for(timeout=10_000)
    assert page.locator("#pools tbody tr").count() == len(seeded["pools"])
    assert "H100" in row.inner_text()
    page.wait_for_selector("#status[data-state='live']", timeout=10_000)

    updated = httpx.post(
        f"{base}/api/compute/pools/update",
        json={"tenantId": "acme", "poolId": pool_id, "gpuModel": "H100-NVL"},
        headers={"authorization": f"Bearer {token}"},
    )
    assert updated.status_code == 200, updated.text
    changed_at = time.monotonic()
    page.wait_for_function(
        "id => document.querySelector(`tr[data-pool-id='${id}']`).innerText.includes('H100-NVL')",
        arg=pool_id,
        timeout=5_000,
    )
    latency = time.monotonic() - changed_at
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "console.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"console: update on the page {latency:.3f} s after REST answered; screenshot {shot}")
    assert latency < 1.0
    assert blocked == []


def test_graphiql_renders_with_no_internet_access(
    demo: tuple[str, dict[str, Any]], browser: Any
) -> None:
    base, _ = demo
    page, blocked = offline_page(browser, base)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{base}/graphql", wait_until="networkidle")
    # GraphiQL's own editor and toolbar exist only once its script ran.
    page.wait_for_selector(".graphiql-container .graphiql-editors", timeout=15_000)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "graphiql.png"
    page.screenshot(path=str(shot))
    print(f"graphiql: screenshot {shot}")
    assert blocked == [] and errors == [], (blocked, errors)
    licence = httpx.get(f"{base}/assets/graphiql@3.8.3/LICENSE")
    assert licence.status_code == 200 and "MIT" in licence.text
    # The page names no CDN: every script and stylesheet is under /assets/.
    html = httpx.get(f"{base}/graphql", headers={"accept": "text/html"}).text
    assert "unpkg.com" not in html and "/assets/graphiql@3.8.3/" in html
