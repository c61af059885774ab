"""The pages a person opens, in a real headless Chromium (the Debian package, driven by
Playwright) against a running `bettercompute serve` on the demo fleet, with every request
beyond this machine refused. The live console (on SQLite and PostgreSQL): its bars equal
what REST answers, its lending rows `pools/lending`, an update's diff shows in its feed
within a second, a `pool.usage` event moves the bars, a lost socket or a pause resumes
without losing an event, and its empty and error states. GraphiQL renders from the
service's own assets. Screenshots go to test-artifacts/ (console-<dialect>.png,
console-usage-<dialect>.png, graphiql.png), each path printed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, urlencode

import httpx
import pytest

from tests.databases import DIALECTS, TestDatabases, service_unavailable
from tests.test_cli import BIN, _free_port, out

# One worker takes them all (scripts/test's --dist loadgroup): its Chromium and served
# demos are module fixtures, started once there rather than once per worker.
pytestmark = pytest.mark.xdist_group("browser")

T = TypeVar("T")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
# How long an event may take to reach the page: delivery waits for the PostgreSQL server's
# oldest running write, of any database (docs/decisions/0012), and a parallel run's other
# workers migrate and drop databases for seconds at a time.
DELIVERY_MS = 30_000


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
        deadline = time.monotonic() + 120  # a hang, not the speed: a busy machine starts slowly
        while True:
            try:
                if httpx.get(f"{self.base}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()  # never left running for the garbage collector to find
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


# --- the console ---------------------------------------------------------------------
#
# Each console test runs against `bettercompute serve` on a demo database of each dialect
# (SQLite file, PostgreSQL database), and reads what the page shows from the data-*
# attributes it renders: quota bars (pool, tenant, resource, used, max), capacity bars
# (pool, resource, booked, allocatable), lending rows, feed entries.


def in_thread(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end in a thread of its own: Playwright's sync API keeps an
    event loop running in this one while a browser is open."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class Demo(NamedTuple):
    server: Served
    seeded: dict[str, Any]  # `bettercompute demo`'s output: tokens, pools
    dialect: str

    @property
    def base(self) -> str:
        return self.server.base

    def token(self, caller: str) -> str:
        token: str = self.seeded["tokens"][caller]
        return token

    def pool(self, name: str) -> str:
        pool_id: str = self.seeded["pools"][name]
        return pool_id


@pytest.fixture(
    scope="module",
    params=[pytest.param(name, marks=getattr(pytest.mark, name), id=name) for name in DIALECTS],
)
def console(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Demo]:
    """`bettercompute demo` then `serve`, on a new database of the dialect."""
    databases = TestDatabases(tmp_path_factory.mktemp("console"))
    try:
        url = in_thread(databases.create_empty(request.param))
        out(url, "db", "upgrade")
        seeded = out(url, "demo")
        server = Served(url)
        server.start()
        try:
            yield Demo(server, seeded, request.param)
        finally:
            server.stop()
    finally:
        in_thread(databases.close())


def rest(base: str, token: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(
        f"{base}/api/compute/{method}", json=body, headers={"authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def open_console(page: Any, base: str, token: str, tenant: str) -> None:
    """Show `tenant`'s pools and wait until the page has read them and follows the stream."""
    page.goto(f"{base}/console")
    page.fill("#token", token)
    page.fill("#tenant", tenant)
    page.click("button[type=submit]")
    page.wait_for_selector("#pools[data-loaded='true']", state="attached", timeout=15_000)
    page.wait_for_selector("#status[data-state='live']", timeout=15_000)


def record_frames(page: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The websocket messages the page sends and receives, in order."""
    sent: list[dict[str, Any]] = []
    received: list[dict[str, Any]] = []
    page.on(
        "websocket",
        lambda ws: (
            ws.on("framesent", lambda frame: sent.append(json.loads(frame))),
            ws.on("framereceived", lambda frame: received.append(json.loads(frame))),
        ),
    )
    return sent, received


# (pool, tenant, resource, used, max) per quota bar; (pool, resource, booked, allocatable)
# per capacity bar.
Bars = tuple[list[tuple[str, str, str, int, int]], list[tuple[str, str, int, int]]]

BARS = """() => [
  [...document.querySelectorAll("#pools .bar[data-kind=quota]")].map((b) =>
    [b.dataset.poolId, b.dataset.tenantId, b.dataset.resource, +b.dataset.used, +b.dataset.max]),
  [...document.querySelectorAll("#pools .bar[data-kind=capacity]")].map((b) =>
    [b.dataset.poolId, b.dataset.resource, +b.dataset.booked, +b.dataset.allocatable])]"""


def page_bars(page: Any) -> Bars:
    quotas, capacity = page.evaluate(BARS)
    return sorted(map(tuple, quotas)), sorted(map(tuple, capacity))


def rest_bars(base: str, token: str, tenant: str) -> Bars:
    """The bars as REST answers them: each pool's `pools/get` (the rows the tenant books
    against, each under its grant's tenant; for the owner every offer's rows) and its
    `pools/capacity` (booked / allocatable; none when the token may not read it)."""
    quotas: dict[tuple[str, str, str], tuple[int, int]] = {}
    capacity: list[tuple[str, str, int, int]] = []
    for listed in rest(base, token, "pools/list", {"tenantId": tenant})["pools"]:
        pool_id = listed["id"]
        pool = rest(base, token, "pools/get", {"tenantId": tenant, "poolId": pool_id})["pool"]
        for q in pool["quotas"]:
            holder = q["grant"]["tenantId"] if q["grant"] else tenant
            quotas[(pool_id, holder, q["resource"])] = (q["used"], q["max"])
        for offer in pool["offers"] or []:
            for q in offer["quotas"]:
                quotas[(pool_id, offer["tenantId"], q["resource"])] = (q["used"], q["max"])
        rows = httpx.post(
            f"{base}/api/compute/pools/capacity",
            json={"tenantId": tenant, "poolId": pool_id},
            headers={"authorization": f"Bearer {token}"},
        )
        if rows.status_code == 200:
            for c in rows.json()["capacity"]:
                capacity.append((pool_id, c["resource"], c["booked"], c["allocatable"]))
        else:
            assert rows.json()["error"]["code"] == "PERMISSION_DENIED", rows.text
    return sorted(k + v for k, v in quotas.items()), sorted(capacity)


def feed(page: Any) -> list[dict[str, Any]]:
    """The feed's entries, newest first: type, pool, cursor and each change's text."""
    entries: list[dict[str, Any]] = page.evaluate(
        """() => [...document.querySelectorAll("#feed > .event")].map((li) => ({
          type: li.dataset.type, poolId: li.dataset.poolId, cursor: li.dataset.cursor || null,
          changes: [...li.querySelectorAll(".change")].map((c) =>
            [c.dataset.path, c.querySelector(".before").innerText,
             c.querySelector(".after").innerText, c.innerText]),
          text: li.innerText }))"""
    )
    return entries


def wait_for_feed(page: Any, predicate: str, arg: Any = None, timeout: int = DELIVERY_MS) -> None:
    """Wait until some feed entry satisfies `predicate`, a JS function of (entry, arg)."""
    page.wait_for_function(
        f"""([arg]) => [...document.querySelectorAll("#feed > .event")].some(
          (li) => ({predicate})(li, arg))""",
        arg=[arg],
        timeout=timeout,
    )


def test_console_shows_the_pools_and_the_diff_of_a_rest_update_live(
    console: Demo, browser: Any
) -> None:
    base, token, pool_id = console.base, console.token("acme-admin"), console.pool("h100")
    page, blocked = offline_page(browser, base)
    open_console(page, base, token, "acme")
    card = page.locator(f"#pools .pool[data-pool-id='{pool_id}']")
    assert page.locator("#pools .pool").count() == len(console.seeded["pools"])
    before = rest(base, token, "pools/get", {"tenantId": "acme", "poolId": pool_id})["pool"]
    # The demo names its pools: the card shows the name, not the id.
    assert before["displayName"] and card.locator(".name").inner_text() == before["displayName"]
    assert f"{before['gpuModel']} · eu-west" in card.locator(".facts").inner_text()

    update_gpu_model(base, token, pool_id, "H100-NVL")
    changed_at = time.monotonic()
    wait_for_feed(
        page, "(li, id) => li.dataset.type === 'pool.updated' && li.dataset.poolId === id", pool_id
    )
    latency = time.monotonic() - changed_at
    (entry,) = [e for e in feed(page) if e["type"] == "pool.updated"]
    after = rest(base, token, "pools/get", {"tenantId": "acme", "poolId": pool_id})["pool"]
    assert entry["changes"] == [
        ["/gpuModel", before["gpuModel"], "H100-NVL", f"/gpuModel {before['gpuModel']} → H100-NVL"]
    ]
    assert entry["cursor"]
    # The diff patched the pool in place: its card says what `get` says now.
    facts = card.locator(".facts").inner_text()
    assert "H100-NVL" in facts and f"v{after['version']}" in facts, facts
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"console-{console.dialect}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"console: the update's diff on the page {latency:.3f} s after REST; screenshot {shot}")
    assert latency < 1.0
    assert blocked == []
    assert csp_violations(page, page.console_lines) == []


@pytest.mark.parametrize(
    ("caller", "tenant"),
    [
        ("acme-admin", "acme"),  # the owner: every tenant's rows, through its offers
        ("acme-viewer", "acme"),  # the owner's viewer: its own rows (no compute:pools:share)
        ("globex-admin", "globex"),  # a guest
        ("globex-research-operator", "globex-research"),  # books on its ancestor's rows
    ],
)
def test_console_bars_equal_what_pools_get_answers_at_load(
    console: Demo, browser: Any, caller: str, tenant: str
) -> None:
    base, token = console.base, console.token(caller)
    page, blocked = offline_page(browser, base)
    open_console(page, base, token, tenant)
    quotas, capacity = page_bars(page)
    assert (quotas, capacity) == rest_bars(base, token, tenant)
    assert quotas and capacity
    # The figures are the bar's text too.
    pool_id, holder, resource, used, most = quotas[-1]
    bar = page.locator(
        f"#pools .bar[data-kind=quota][data-pool-id='{pool_id}']"
        f"[data-tenant-id='{holder}'][data-resource='{resource}'] .value"
    )
    assert bar.inner_text() == f"{used} / {'unlimited' if most == 2**31 - 1 else most}"
    assert blocked == [] and csp_violations(page, page.console_lines) == []


LENDING_ROWS = """() => [...document.querySelectorAll("#lending tbody tr")].map((tr) => ({
  poolId: tr.dataset.poolId, resource: tr.dataset.resource, offered: +tr.dataset.offered,
  guestUsed: +tr.dataset.guestUsed, booked: +tr.dataset.booked,
  allocatable: +tr.dataset.allocatable,
  overcommit: tr.dataset.overcommit === "" ? null : +tr.dataset.overcommit,
  holders: tr.lastElementChild.innerText }))"""


def test_console_lending_rows_equal_the_rest_answer(console: Demo, browser: Any) -> None:
    """The owner's lending view: `pools/lending`'s rows, in its order, each with who
    holds what of it (the guests' rows: used / max)."""
    base, token = console.base, console.token("acme-admin")
    page, _ = offline_page(browser, base)
    open_console(page, base, token, "acme")
    shown = page.evaluate(LENDING_ROWS)
    answer = rest(base, token, "pools/lending", {"tenantId": "acme", "first": 100})["lending"]
    keys = ("poolId", "resource", "offered", "guestUsed", "booked", "allocatable", "overcommit")
    assert [{k: row[k] for k in keys} for row in shown] == [
        {k: row[k] for k in keys} for row in answer
    ]
    holders = {(row["poolId"], row["resource"]): row["holders"] for row in shown}
    # The demo: globex-research books 4 GPUs of the H100 pool on globex's offer (16).
    assert holders[(console.pool("h100"), "gpu")] == "globex 4 / 16"
    assert holders[(console.pool("a100-mig"), "gpu.mig")] == "initech 6 / 16"
    assert holders[(console.pool("l4-timeslice"), "gpu")] == "none"
    # A tenant that may not share sees no lending rows, and says why.
    viewer, _ = offline_page(browser, base)
    open_console(viewer, base, console.token("acme-viewer"), "acme")
    assert viewer.locator("#lending tbody tr").count() == 0
    assert "PERMISSION_DENIED" in viewer.locator("#lending-note").inner_text()


def test_console_applies_a_contract_shaped_usage_event_fed_in_the_page(
    console: Demo, browser: Any
) -> None:
    """Feeds the page's event function a `pool.usage` event shaped as CONTRACT section 10
    says (rows after the change; test_console_bars_follow_a_booking_live has the service
    send one), and a
    `pool.updated` carrying a `/displayName` change (issue 23's names), and checks what
    the bars, the lending view and the feed then show."""
    base, token, pool_id = console.base, console.token("acme-admin"), console.pool("h100")
    page, _ = offline_page(browser, base)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.post_data or ""))
    open_console(page, base, token, "acme")
    # The schema has displayName (issue 23): the page asks for it.
    assert any("displayName" in body for body in requests)
    pool = rest(base, token, "pools/get", {"tenantId": "acme", "poolId": pool_id})["pool"]
    (guest,) = [o for o in pool["offers"] if o["tenantId"] == "globex"]
    (row,) = guest["quotas"]
    (cap,) = rest(base, token, "pools/capacity", {"tenantId": "acme", "poolId": pool_id})[
        "capacity"
    ]
    used, booked = row["used"] + 2, cap["booked"] + 2
    usage = {
        "type": "pool.usage",
        "poolId": pool_id,
        "tenantId": "globex-research",
        "occurredAt": "2026-12-01T12:00:00Z",
        "data": {
            "quotas": [{"tenantId": "globex", "resource": "gpu", "max": row["max"], "used": used}],
            "capacity": [
                {"resource": "gpu", "booked": booked, "available": cap["allocatable"] - booked}
            ],
        },
    }
    page.evaluate("event => window.bcConsole.applyEvent(event)", usage)
    quotas, capacity = page_bars(page)
    assert (pool_id, "globex", "gpu", used, row["max"]) in quotas
    assert (pool_id, "gpu", booked, cap["allocatable"]) in capacity
    # The other rows did not move.
    before_quotas, before_capacity = rest_bars(base, token, "acme")
    assert [q for q in quotas if q[:3] != (pool_id, "globex", "gpu")] == [
        q for q in before_quotas if q[:3] != (pool_id, "globex", "gpu")
    ]
    assert [c for c in capacity if c[:2] != (pool_id, "gpu")] == [
        c for c in before_capacity if c[:2] != (pool_id, "gpu")
    ]
    (lent,) = [r for r in page.evaluate(LENDING_ROWS) if r["poolId"] == pool_id]
    assert (lent["guestUsed"], lent["booked"], lent["holders"]) == (
        used,
        booked,
        f"globex {used} / {row['max']}",
    )
    (entry,) = [e for e in feed(page) if e["type"] == "pool.usage"]
    assert f"globex · gpu: {used} / {row['max']} used" in entry["text"]
    assert f"capacity gpu: {booked} booked" in entry["text"]

    named = {
        "type": "pool.updated",
        "poolId": pool_id,
        "tenantId": "acme",
        "occurredAt": "2026-12-01T12:00:01Z",
        "data": {
            "version": pool["version"] + 1,
            "changed": ["displayName"],
            "changes": [{"path": "/displayName", "before": None, "after": "Training H100s"}],
        },
    }
    page.evaluate("event => window.bcConsole.applyEvent(event)", named)
    card = page.locator(f"#pools .pool[data-pool-id='{pool_id}']")
    assert card.locator(".name").inner_text() == "Training H100s"
    assert card.locator(".id").inner_text() == pool_id
    (entry,) = [e for e in feed(page) if e["type"] == "pool.updated"]
    assert entry["changes"][0][:3] == ["/displayName", "none", "Training H100s"]
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"console-usage-{console.dialect}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"console: a contract-shaped pool.usage applied; screenshot {shot}")


def test_console_bars_follow_a_booking_live(console: Demo, browser: Any) -> None:
    """End to end: a descendant books through its ancestor's offer, and the owner's open
    console shows the bars `pools/get` answers after it, from the events alone."""
    base, token, pool_id = console.base, console.token("acme-admin"), console.pool("h100")
    page, _ = offline_page(browser, base)
    open_console(page, base, token, "acme")
    booker = console.token("globex-research-operator")
    booked = rest(
        base,
        booker,
        "reservations/create",
        {"tenantId": "globex-research", "poolId": pool_id, "resources": {"gpu": 2}},
    )["reservation"]
    try:
        expected = rest_bars(base, token, "acme")
        # Wait until the bars of the booked pool show what REST says, then compare all.
        wanted = sorted(
            json.dumps(q, separators=(",", ":")) for q in expected[0] if q[0] == pool_id
        )
        page.wait_for_function(
            f"""([pool, wanted]) => {{ const [quotas] = ({BARS})();
              const shown = quotas.filter((q) => q[0] === pool).map((q) => JSON.stringify(q));
              return JSON.stringify(shown.sort()) === JSON.stringify(wanted); }}""",
            arg=[pool_id, wanted],
            timeout=DELIVERY_MS,
        )
        assert page_bars(page) == expected
        assert any(e["type"] == "pool.usage" for e in feed(page))
    finally:
        rest(
            base,
            booker,
            "reservations/release",
            {"tenantId": "globex-research", "reservationId": booked["id"]},
        )


def subscribes(sent: list[dict[str, Any]]) -> list[Any]:
    """The `after` of each subscribe the page sent, in order."""
    return [m["payload"]["variables"]["after"] for m in sent if m["type"] == "subscribe"]


def last_cursor(page: Any) -> str:
    cursor: str = page.evaluate("() => window.bcConsole.state.cursor")
    return cursor


def close_socket(page: Any) -> str:
    """Close the page's socket and return the cursor it had then. Read in the same turn:
    a closing WebSocket dispatches no more messages, while an event (a usage catch-up,
    say) may still arrive before a separate read."""
    cursor: str = page.evaluate(
        "() => { const c = window.bcConsole.state.cursor; window.bcConsole.socket().close();"
        " return c; }"
    )
    return cursor


def updates_of(page: Any, model: str) -> int:
    """How many feed entries show `model` as a /gpuModel change's after."""
    return sum(
        1
        for e in feed(page)
        for path, _, after, _ in e["changes"]
        if path == "/gpuModel" and after == model
    )


def test_console_resumes_after_its_socket_closes_without_losing_an_event(
    console: Demo, browser: Any
) -> None:
    """The socket closed under the page (from the page: no restart needed), and a pause
    the person asks for: each time the page resubscribes with `after` = the last cursor
    it had, and the update made meanwhile shows once in the feed."""
    base, token, pool_id = console.base, console.token("acme-admin"), console.pool("l40s-mps")
    page, _ = offline_page(browser, base)
    sent, _ = record_frames(page)
    open_console(page, base, token, "acme")
    update_gpu_model(base, token, pool_id, "L40S-A")
    page.wait_for_function("() => window.bcConsole.state.cursor !== null", timeout=DELIVERY_MS)
    cursor = close_socket(page)  # the connection is lost
    update_gpu_model(base, token, pool_id, "L40S-B")  # while away, or just after: both count
    page.wait_for_selector("#status[data-state='live']", timeout=15_000)
    wait_for_feed(page, "(li) => li.innerText.includes('L40S-B')")
    assert subscribes(sent)[-1] == cursor and len(subscribes(sent)) == 2
    assert updates_of(page, "L40S-A") == 1 and updates_of(page, "L40S-B") == 1
    assert "L40S-B" in page.locator(f"#pools .pool[data-pool-id='{pool_id}'] .facts").inner_text()

    page.click("#pause")
    page.wait_for_selector("#status[data-state='paused']", timeout=5_000)
    cursor = last_cursor(page)  # the socket is closed: nothing moves it now
    update_gpu_model(base, token, pool_id, "L40S-C")  # certainly while away
    assert updates_of(page, "L40S-C") == 0
    page.click("#pause")  # Resume
    page.wait_for_selector("#status[data-state='live']", timeout=15_000)
    wait_for_feed(page, "(li) => li.innerText.includes('L40S-C')")
    assert subscribes(sent)[-1] == cursor and len(subscribes(sent)) == 3
    assert [updates_of(page, m) for m in ("L40S-A", "L40S-B", "L40S-C")] == [1, 1, 1]


def test_console_reconnects_and_resumes_after_the_server_restarts(
    console: Demo, browser: Any
) -> None:
    base, token, pool_id = console.base, console.token("acme-admin"), console.pool("l4-timeslice")
    page, _ = offline_page(browser, base)
    sent, _ = record_frames(page)
    open_console(page, base, token, "acme")
    update_gpu_model(base, token, pool_id, "L4-A")
    wait_for_feed(page, "(li) => li.innerText.includes('L4-A')")
    console.server.stop()
    page.wait_for_selector("#status[data-state='offline']", timeout=10_000)
    cursor = last_cursor(page)  # the socket is closed: nothing moves it now
    assert "Reconnecting" in page.locator("#error").inner_text()
    console.server.start()
    page.wait_for_selector("#status[data-state='live']", timeout=20_000)
    update_gpu_model(base, token, pool_id, "L4-B")
    wait_for_feed(page, "(li) => li.innerText.includes('L4-B')")
    after = subscribes(sent)
    assert len(after) >= 2 and after[0] is None and after[-1] == cursor
    assert updates_of(page, "L4-A") == 1 and updates_of(page, "L4-B") == 1
    assert page.locator("#error").is_hidden()


def test_console_shows_a_clear_empty_state(console: Demo, browser: Any) -> None:
    """A tenant that owns no pool and is offered none."""
    url = console.server.url
    out(url, "tenant", "create", "umbrella")
    caller = out(url, "caller", "create", "--tenant", "umbrella", "--role", "admin")
    page, _ = offline_page(browser, console.base)
    open_console(page, console.base, caller["token"], "umbrella")
    empty = page.locator("#empty")
    assert empty.is_visible() and "umbrella" in empty.inner_text()
    assert "No pools" in empty.inner_text()
    assert page.locator("#pools .pool").count() == 0
    assert page.locator("#lending").is_hidden() and page.locator("#error").is_hidden()
    # A reload shows the same tenant again: the tab remembers the token and tenant.
    page.reload()
    page.wait_for_selector("#pools[data-loaded='true']", state="attached", timeout=15_000)
    page.wait_for_selector("#status[data-state='live']", timeout=15_000)
    assert page.locator("#empty").is_visible() and "umbrella" in empty.inner_text()


def test_console_shows_a_clear_error_state_for_a_bad_token_and_a_service_down(
    console: Demo, browser: Any
) -> None:
    base = console.base
    page, _ = offline_page(browser, base)
    page.goto(f"{base}/console")
    page.fill("#token", "bct_not-a-token")
    page.fill("#tenant", "acme")
    page.click("button[type=submit]")
    page.wait_for_selector("#status[data-state='error']", timeout=10_000)
    error = page.locator("#error")
    assert error.is_visible() and "token was refused" in error.inner_text()
    assert page.locator("#pools .pool").count() == 0 and page.locator("#empty").is_hidden()

    # The service goes away with the page open: the page says so and keeps trying.
    page.fill("#token", console.token("acme-admin"))
    console.server.stop()
    try:
        page.click("button[type=submit]")
        page.wait_for_selector("#status[data-state='offline']", timeout=10_000)
        assert "not reachable" in error.inner_text()
        assert page.locator("#pools .pool").count() == 0 and page.locator("#empty").is_hidden()
    finally:
        console.server.start()
    page.wait_for_selector("#status[data-state='live']", timeout=20_000)
    page.wait_for_selector("#pools[data-loaded='true']", state="attached", timeout=10_000)
    assert page.locator("#pools .pool").count() == len(console.seeded["pools"])
    assert error.is_hidden()


def test_console_shows_a_name_given_through_rest_live_and_after_a_reload(
    console: Demo, browser: Any
) -> None:
    """`pools/label` (issue 23's names): the card follows the pool.updated's /displayName
    change live, and a reload reads the name; removing it shows the id again."""
    base, token, pool_id = console.base, console.token("acme-admin"), console.pool("l40s-mps")
    page, _ = offline_page(browser, base)
    open_console(page, base, token, "acme")
    card = page.locator(f"#pools .pool[data-pool-id='{pool_id}']")
    demo = rest(base, token, "pools/get", {"tenantId": "acme", "poolId": pool_id})["pool"]
    assert card.locator(".name").inner_text() == demo["displayName"]
    body = {"tenantId": "acme", "poolId": pool_id, "displayName": "Inference L40S"}

    def shown(name: str) -> None:
        page.wait_for_function(
            "([id, name]) => document.querySelector("
            "`#pools .pool[data-pool-id='${id}'] .name`)?.innerText === name",
            arg=[pool_id, name],
            timeout=DELIVERY_MS,
        )

    try:
        rest(base, token, "pools/label", {**body, "labels": {"team": "ml"}})
        shown("Inference L40S")
        page.reload()
        page.wait_for_selector("#pools[data-loaded='true']", state="attached", timeout=15_000)
        assert card.locator(".name").inner_text() == "Inference L40S"
        rest(base, token, "pools/label", {**body, "displayName": ""})
        shown(pool_id)  # no name: the id
    finally:
        rest(
            base,
            token,
            "pools/label",
            {**body, "displayName": demo["displayName"], "labels": demo["labels"]},
        )
