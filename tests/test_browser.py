"""The pages a person opens, in a real headless Chromium (the Debian package, driven by
Playwright) against a running `bettercompute serve` on the demo fleet, with every request
beyond this machine refused: the live console shows the demo pools and a REST update
appears within a second; GraphiQL renders from the service's own assets. Screenshots go
to test-artifacts/ (console.png, graphiql.png)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest

from tests.databases import service_unavailable
from tests.test_cli import BIN, _free_port, out

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


class Served:
    """`bettercompute serve` on a demo database, restartable on the same port."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(BIN), "serve", "--port", str(self.port)],
            env={**os.environ, "BETTERCOMPUTE_DATABASE_URL": self.url},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.base}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, Any]]]:
    """`bettercompute demo` then `serve` on a SQLite file: (the server, demo's output)."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('browser')}/demo.db"
    seeded = out(url, "demo")
    server = Served(url)
    server.start()
    try:
        yield server, seeded
    finally:
        server.stop()


@pytest.fixture
def demo(served: tuple[Served, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    return served[0].base, served[1]


def update_gpu_model(base: str, token: str, pool_id: str, model: str) -> None:
    updated = httpx.post(
        f"{base}/api/compute/pools/update",
        json={"tenantId": "acme", "poolId": pool_id, "gpuModel": model},
        headers={"authorization": f"Bearer {token}"},
    )
    assert updated.status_code == 200, updated.text


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


# Playwright's init scripts run outside the page's Content-Security-Policy: this one keeps
# every violation the policy reports, for the tests to read.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.effectiveDirective} blocked ${e.blockedURI || "inline"} (${e.sourceFile}:${e.lineNumber})`));
"""


def csp_violations(page: Any, console: list[str]) -> list[str]:
    """What the page's policy refused: as reported to the page, and as logged."""
    reported: list[str] = page.evaluate("() => window.__cspViolations")
    logged = [line for line in console if "Content Security Policy" in line]
    return reported + logged


def offline_page(browser: Any, base: str) -> tuple[Any, list[str]]:
    """A page that may reach only the server under test; what else it asked for is kept.
    The page's console lines are kept in `page.console_lines`."""
    context = browser.new_context(viewport={"width": 1400, "height": 800})
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    blocked: list[str] = []

    def route(route: Any) -> None:
        if route.request.url.startswith(base) or route.request.url.startswith("data:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.console_lines = []
    page.on("console", lambda message: page.console_lines.append(message.text))
    return page, blocked


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

    update_gpu_model(base, token, pool_id, "H100-NVL")
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
    assert csp_violations(page, page.console_lines) == []


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
    assert csp_violations(page, page.console_lines) == []
    licence = httpx.get(f"{base}/assets/graphiql@3.8.3/LICENSE")
    assert licence.status_code == 200 and "MIT" in licence.text
    # The page names no CDN: every script and stylesheet is under /assets/.
    html = httpx.get(f"{base}/graphql", headers={"accept": "text/html"}).text
    assert "unpkg.com" not in html and "/assets/graphiql@3.8.3/" in html


def test_graphiql_runs_a_subscription_with_its_headers_pane(
    demo: tuple[str, dict[str, Any]], browser: Any
) -> None:
    """GraphiQL sends the headers pane as the connection_init payload, with the key as
    typed: {"Authorization": ...}."""
    base, seeded = demo
    token = seeded["tokens"]["acme-admin"]
    pool_id = seeded["pools"]["a100-mig"]
    page, blocked = offline_page(browser, base)
    query = 'subscription { poolEvents(tenantId: "acme") { type poolId } }'
    headers = json.dumps({"Authorization": f"Bearer {token}"})
    page.goto(f"{base}/graphql?{urlencode({'q': query, 'headers': headers}, quote_via=quote)}")
    page.click(".graphiql-execute-button", timeout=15_000)
    result = page.locator(".graphiql-response")
    # The subscription starts at some point after the click: change the pool until an
    # event shows (each update is one event), within a deadline.
    deadline = time.monotonic() + 15
    n = 0
    while "pool.updated" not in result.inner_text():
        assert time.monotonic() < deadline, result.inner_text()
        n += 1
        update_gpu_model(base, token, pool_id, f"A100-{n}")
        page.wait_for_timeout(300)
    assert pool_id in result.inner_text() and blocked == []
    assert csp_violations(page, page.console_lines) == []  # the websocket is 'self'


def test_graphiql_runs_a_query_under_its_content_security_policy(
    demo: tuple[str, dict[str, Any]], browser: Any
) -> None:
    base, seeded = demo
    token = seeded["tokens"]["acme-admin"]
    page, blocked = offline_page(browser, base)
    query = '{ pools(tenantId: "acme") { nodes { id gpuModel } } }'
    headers = json.dumps({"Authorization": f"Bearer {token}"})
    page.goto(f"{base}/graphql?{urlencode({'q': query, 'headers': headers}, quote_via=quote)}")
    page.click(".graphiql-execute-button", timeout=15_000)
    page.wait_for_function(
        "id => document.querySelector('.graphiql-response').innerText.includes(id)",
        arg=seeded["pools"]["h100"],
        timeout=15_000,
    )
    assert blocked == []
    assert csp_violations(page, page.console_lines) == []


def test_the_pages_send_their_security_headers(demo: tuple[str, dict[str, Any]]) -> None:
    """Each page its own policy (nothing inline unhashed, nothing from elsewhere, never
    framed); every other answer, JSON included, nosniff and a policy that allows nothing."""
    base, _ = demo
    pages = {
        "console": httpx.get(f"{base}/console"),
        "graphiql": httpx.get(f"{base}/graphql", headers={"accept": "text/html"}),
    }
    for name, page in pages.items():
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, name
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, name
        assert page.headers["x-frame-options"] == "DENY", name
        assert page.headers["x-content-type-options"] == "nosniff", name
    assert "script-src 'self' 'sha256-" in pages["graphiql"].headers["content-security-policy"]
    api = httpx.post(f"{base}/api/compute/pools/list", json={"tenantId": "acme"})
    assert api.status_code == 401
    assert api.headers["x-content-type-options"] == "nosniff"
    assert api.headers["content-security-policy"].startswith("default-src 'none'")


def test_console_reconnects_and_resumes_after_the_last_cursor(
    served: tuple[Served, dict[str, Any]], browser: Any
) -> None:
    server, seeded = served
    base, token = server.base, seeded["tokens"]["acme-admin"]
    pool_id = seeded["pools"]["l4-timeslice"]
    page, _ = offline_page(browser, base)
    sent: list[dict[str, Any]] = []
    received: list[dict[str, Any]] = []
    page.on(
        "websocket",
        lambda ws: (
            ws.on("framesent", lambda frame: sent.append(json.loads(frame))),
            ws.on("framereceived", lambda frame: received.append(json.loads(frame))),
        ),
    )
    page.goto(f"{base}/console")
    page.fill("#token", token)
    page.fill("#tenant", "acme")
    page.click("button[type=submit]")
    page.wait_for_selector("#status[data-state='live']", timeout=10_000)
    update_gpu_model(base, token, pool_id, "L4-A")
    page.wait_for_function("() => document.body.innerText.includes('L4-A')", timeout=5_000)
    cursor = next(m for m in received if m["type"] == "next")["payload"]["data"]["poolEvents"]
    server.stop()
    page.wait_for_selector("#status[data-state='offline']", timeout=10_000)
    server.start()
    page.wait_for_selector("#status[data-state='live']", timeout=20_000)
    update_gpu_model(base, token, pool_id, "L4-B")
    page.wait_for_function("() => document.body.innerText.includes('L4-B')", timeout=5_000)
    subscribes = [m for m in sent if m["type"] == "subscribe"]
    assert len(subscribes) >= 2
    assert subscribes[0]["payload"]["variables"]["after"] is None
    assert subscribes[-1]["payload"]["variables"]["after"] == cursor["cursor"]


def test_graphiql_takes_a_token_refetches_the_schema_and_runs_its_dashboard_query(
    demo: tuple[str, dict[str, Any]], browser: Any, tmp_path: Path
) -> None:
    """The labeled token field: Docs shows the schema once a token is typed (no press of
    the re-fetch icon), the default dashboard query answers the demo pools, and the
    token is still there after a reload."""
    base, seeded = demo
    token = seeded["tokens"]["acme-admin"]
    page, blocked = offline_page(browser, base)
    page.goto(f"{base}/graphql")
    page.wait_for_selector(".graphiql-container .graphiql-editors", timeout=15_000)
    page.get_by_label("Authorization token").fill(token)
    page.click("button[aria-label='Show Documentation Explorer']")
    docs = page.locator(".graphiql-doc-explorer")
    docs.get_by_text("Root Types").wait_for(timeout=15_000)
    assert "Error fetching schema" not in docs.inner_text()
    with page.expect_response(
        lambda r: r.request.method == "POST" and "Dashboard" in (r.request.post_data or "")
    ) as answered:
        page.click(".graphiql-execute-button")
    page.wait_for_function(
        "id => document.querySelector('.graphiql-response').innerText.includes(id)",
        arg=seeded["pools"]["h100"],
        timeout=15_000,
    )
    answer = answered.value.json()
    assert "errors" not in answer, answer
    nodes = answer["data"]["pools"]["nodes"]
    assert all(node["capacity"] and node["quotas"] for node in nodes), nodes
    listed = httpx.post(
        f"{base}/api/compute/pools/list",
        json={"tenantId": "acme"},
        headers={"authorization": f"Bearer {token}"},
    ).json()
    ids = [pool["id"] for pool in listed["pools"]]
    assert ids and sorted(node["id"] for node in nodes) == sorted(ids)
    shot = tmp_path / "graphiql-dashboard.png"
    page.screenshot(path=str(shot))
    print(f"graphiql: dashboard query answered; screenshot {shot}")
    page.reload()
    page.wait_for_selector(".graphiql-container .graphiql-editors", timeout=15_000)
    assert page.get_by_label("Authorization token").input_value() == token
    assert blocked == []
    assert csp_violations(page, page.console_lines) == []


def test_graphiql_refetches_the_schema_when_the_headers_pane_changes(
    demo: tuple[str, dict[str, Any]], browser: Any
) -> None:
    """A token typed into the headers pane instead: Docs shows the schema without the
    re-fetch icon being pressed."""
    base, seeded = demo
    token = seeded["tokens"]["acme-admin"]
    page, blocked = offline_page(browser, base)
    page.goto(f"{base}/graphql")
    page.wait_for_selector(".graphiql-container .graphiql-editors", timeout=15_000)
    page.click("button[aria-label='Show Documentation Explorer']")
    docs = page.locator(".graphiql-doc-explorer")
    docs.get_by_text("Error fetching schema").wait_for(timeout=15_000)  # no token yet
    page.locator(".graphiql-editor-tools").get_by_text("Headers", exact=True).click()
    page.click(".graphiql-editor-tool .graphiql-editor:not(.hidden) .CodeMirror")
    page.keyboard.insert_text(json.dumps({"Authorization": f"Bearer {token}"}))
    docs.get_by_text("Root Types").wait_for(timeout=15_000)
    assert "Error fetching schema" not in docs.inner_text()
    assert blocked == []
    assert csp_violations(page, page.console_lines) == []
