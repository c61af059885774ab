"""GraphiQL wherever the service is installed: the page opens on an example dashboard
query valid against the schema; the assets the package ships (schema/graphiql_assets) are
the lock's files byte for byte; and a wheel built from this tree, unpacked away from the
checkout, serves a page that names no other host, every asset of which answers 200."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
from graphql import build_schema, parse, validate

from schema.graphiql import DEFAULT_ASSETS_DIR, graphiql_html, served_files
from tests.databases import service_unavailable
from tests.test_cli import _free_port

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / "web" / "node_modules"
# Every URL the page loads: src= and href= attributes.
_URLS = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


def default_query(html: str) -> str:
    match = re.search(r"const EXAMPLE_QUERY = `(.*?)`;", html, re.DOTALL)
    assert match is not None
    return match.group(1).replace("\\`", "`")


def test_the_page_opens_on_a_valid_dashboard_query() -> None:
    html = graphiql_html("")
    query = default_query(html)
    assert "Welcome to GraphiQL" not in html and "Authorization token" in query
    schema = build_schema((ROOT / "schema" / "schema.graphql").read_text())
    document = parse(query)
    assert validate(schema, document) == []
    assert "quotas" in query and "capacity" in query
    # The field that says where the token goes is labeled on the page.
    assert '<label for="token">Authorization token</label>' in html


def test_the_shipped_assets_are_the_locks_files() -> None:
    """scripts/graphiql-assets copied them: same bytes as web/node_modules, at the versions
    web/package-lock.json pins (rerun it after changing the lock)."""
    if not (NODE_MODULES / "graphiql").is_dir():
        service_unavailable("web/node_modules is not installed (scripts/web-assets)")
    lock = json.loads((ROOT / "web" / "package-lock.json").read_text())["packages"]
    shipped = {p.relative_to(DEFAULT_ASSETS_DIR) for p in DEFAULT_ASSETS_DIR.rglob("*")}
    expected: set[Path] = set()
    for package, version, path in served_files():
        assert lock[f"node_modules/{package}"]["version"] == version, package
        for name in (path, "package.json"):
            if (NODE_MODULES / package / name).exists():
                expected.add(Path(package) / name)
    assert {p for p in shipped if (DEFAULT_ASSETS_DIR / p).is_file()} == expected
    for file in expected:
        assert (DEFAULT_ASSETS_DIR / file).read_bytes() == (NODE_MODULES / file).read_bytes()


def test_an_installed_wheel_serves_graphiql_with_no_other_host(tmp_path: Path) -> None:
    wheels, site, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # Built from a copy of the checkout's files (no stale build/ of an earlier build).
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(wheels)],
        cwd=source, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("bettercompute*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    # The unpacked package, not the checkout: its own directory first on the path, run
    # from elsewhere.
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import schema.graphiql as g; print(g.DEFAULT_ASSETS_DIR)"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert where == str(site / "schema" / "graphiql_assets")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
         "serve", "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**env, "BETTERCOMPUTE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/db.db"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline or serve.poll() is not None:
                    raise
                time.sleep(0.1)
        html = httpx.get(f"{base}/graphql", headers={"accept": "text/html"}).text
        urls = _URLS.findall(html)
        assets = [url for url in urls if not url.startswith("data:")]
        assert len(assets) == len({u for _, _, u in served_files() if u != "LICENSE"})
        assert all(url.startswith("/assets/") for url in assets), assets
        assert "unpkg.com" not in html and "https://" not in html
        for url in assets:
            assert httpx.get(f"{base}{url}").status_code == 200, url
        assert "MIT" in httpx.get(f"{base}/assets/graphiql@3.8.3/LICENSE").text
    finally:
        serve.terminate()
        serve.wait(timeout=10)
