"""The `bettercompute` console script, run as an operator would run it."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.server import create_app
from tests.support import Api

BIN = Path(sys.executable).with_name("bettercompute")
ROOT = Path(__file__).resolve().parents[1]


def run(
    url: str, *args: str, ok: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BETTERCOMPUTE_DATABASE_URL": url}
    done = subprocess.run(
        [str(BIN), *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def out(url: str, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(run(url, *args).stdout)
    return result


async def test_operator_walkthrough(fresh_database_url: str) -> None:
    url = fresh_database_url
    assert out(url, "db", "upgrade")["revision"]
    assert out(url, "tenant", "create", "acme") == {"tenantId": "acme"}
    assert out(url, "tenant", "create", "acme-lab", "--parent", "acme") == {"tenantId": "acme-lab"}
    site = out(url, "site", "create", "--tenant", "acme", "--kind", "platform", "--region", "eu")
    assert site["siteId"].startswith("site_")
    account = out(url, "provider-account", "create", "--tenant", "acme")
    assert account["providerAccountId"].startswith("pacct_")
    caller = out(
        url, "caller", "create", "--tenant", "acme", "--role", "admin", "--where", "region=eu"
    )
    assert caller["callerId"].startswith("caller_") and caller["token"]
    token = out(url, "token", "create", "--caller", caller["callerId"])["token"]
    assert token != caller["token"]
    assert out(url, "token", "revoke", "--token", token) == {"revoked": True}


async def test_failures_exit_non_zero_with_one_line(fresh_database_url: str) -> None:
    url = fresh_database_url
    run(url, "db", "upgrade")
    cases = [
        ("tenant", "create", "no spaces allowed"),
        ("site", "create", "--tenant", "ghost", "--kind", "custom", "--region", "eu"),
        ("caller", "create", "--tenant", "ghost", "--role", "admin"),
        ("node", "add", "--pool", "pool_01m8k80w4x6ye1p6jrgt9p57kb", "--gpus", "4"),
    ]
    for args in cases:
        done = run(url, *args, ok=False)
        assert done.returncode != 0 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("bettercompute: ")


async def test_a_fleet_admin_on_a_fresh_database_acts_for_any_tenant(
    fresh_database_url: str,
) -> None:
    """CONTRACT 2, exactly as an operator runs it: the fleet tenant comes with the schema."""
    url = fresh_database_url
    run(url, "db", "upgrade")
    admin = out(url, "caller", "create", "--tenant", "fleet", "--role", "fleet-admin")
    assert admin["callerId"].startswith("caller_") and admin["token"].startswith("bct_")
    out(url, "tenant", "create", "acme")
    site = out(url, "site", "create", "--tenant", "acme", "--kind", "custom", "--region", "eu")

    application = create_app(Settings(database_url=url))
    async with (
        application.router.lifespan_context(application),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://testserver"
        ) as client,
    ):
        api = Api(client)
        body = {"tenantId": "acme", "siteId": site["siteId"], "class": "metal-host"}
        created = (await api.ok(admin["token"], "pools/create", body))["pool"]
        listed = await api.ok(admin["token"], "pools/list", {"tenantId": "acme"})
    assert [(p["id"], p["owned"]) for p in listed["pools"]] == [(created["id"], True)]


async def test_the_fleet_tenant_cannot_be_created_again_or_given_a_parent(
    fresh_database_url: str,
) -> None:
    url = fresh_database_url
    run(url, "db", "upgrade")
    out(url, "tenant", "create", "acme")
    for args in (("tenant", "create", "fleet"), ("tenant", "create", "fleet", "--parent", "acme")):
        done = run(url, *args, ok=False)
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr == (
            "bettercompute: CONFLICT: tenant fleet is built in: it exists on every database,"
            " with no parent\n"
        )
    # Fleet may still be a parent: its children are ordinary tenants.
    assert out(url, "tenant", "create", "ops", "--parent", "fleet") == {"tenantId": "ops"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["sqlite"])
def test_demo_then_serve_answers_the_printed_curl(tmp_path: Path, dialect: str) -> None:
    """The README's first command: demo seeds the embedded default, serve answers."""
    url = f"sqlite+aiosqlite:///{tmp_path}/demo.db"
    demo = out(url, "demo")
    assert demo["seeded"] is True and set(demo["tokens"]) >= {"globex-admin", "fleet-admin"}
    again = out(url, "demo")  # a second run keeps the data and issues fresh tokens
    assert (
        again["seeded"] is False
        and again["tokens"]["globex-admin"] != demo["tokens"]["globex-admin"]
    )

    port = _free_port()
    env = {**os.environ, "BETTERCOMPUTE_DATABASE_URL": url}
    server = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        token = again["tokens"]["globex-admin"]
        assert token in again["try"]
        listed = httpx.post(
            f"{base}/api/compute/pools/list",
            json={"tenantId": "globex"},
            headers={"authorization": f"Bearer {token}"},
        )
        assert listed.status_code == 200
        pools = listed.json()["pools"]
        assert [p["gpuModel"] for p in pools] == ["H100"]
        assert pools[0]["owned"] is False and pools[0]["quotas"][0]["max"] == 16
    finally:
        server.terminate()
        server.wait(timeout=10)


def _first_line(stream: Any, timeout_s: float) -> str:
    """The first line a child prints, waiting at most `timeout_s` (it may hang)."""
    import threading

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert lines, f"nothing printed within {timeout_s} s"
    return lines[0]


def test_serve_demo_prints_hints_for_the_port_it_serves(tmp_path: Path) -> None:
    """`scripts/serve --port P` (serve --demo): the printed curl, pasted as it is, answers
    from port P, and the GraphiQL and console URLs name P too."""
    import shlex

    port = _free_port()
    env = {**os.environ, "BETTERCOMPUTE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/d.db"}
    server = subprocess.Popen(
        [str(BIN), "serve", "--demo", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        hints = json.loads(_first_line(server.stdout, 60))
        base = f"http://127.0.0.1:{port}"
        assert hints["graphiql"] == f"{base}/graphql" and hints["console"] == f"{base}/console"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        pasted = subprocess.run(
            shlex.split(hints["try"]), capture_output=True, text=True, timeout=30, check=True
        )
        assert [p["gpuModel"] for p in json.loads(pasted.stdout)["pools"]] == ["H100"]
        assert httpx.get(hints["console"]).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=10)
        assert server.stdout is not None
        server.stdout.close()


def _leaf_commands() -> list[list[str]]:
    from app.cli import _parser

    def walk(parser: Any, path: list[str]) -> list[list[str]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [path]
        return [leaf for name, p in subs[0].choices.items() for leaf in walk(p, [*path, name])]

    return walk(_parser(), [])


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    from app.cli import main

    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_every_command_says_what_it_does_with_an_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    leaves = _leaf_commands()
    assert ["caller", "create"] in leaves and ["serve"] in leaves and len(leaves) >= 12
    for command in leaves:
        text = _help(capsys, *command)
        example = text.split("example:\n", 1)
        assert len(example) == 2, f"{command}: no example"
        assert example[1].lstrip().split("\n")[0].find(f"bettercompute {command[0]}") >= 0
        described = text.split("\n\n")[1]  # the paragraph after the usage line
        assert len(described) > 20 and "options" not in described, command


def test_caller_help_names_every_role_and_where_key(capsys: pytest.CaptureFixture[str]) -> None:
    from app.iam.roles import BINDING_ATTRIBUTES, ROLE_PERMISSIONS

    text = " ".join(_help(capsys, "caller", "create").split())
    assert all(f"{role} (" in text for role in ROLE_PERMISSIONS)
    assert all(key in text for key in BINDING_ATTRIBUTES)
    assert "(default: 127.0.0.1)" in _help(capsys, "serve")  # defaults are shown
    top = _help(capsys)
    assert "bettercompute serve --demo" in top and "GPU pools" in top


def test_the_readme_shows_the_revision_db_upgrade_prints(fresh_database_url: str) -> None:
    import re

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    shown = re.search(r'bettercompute db upgrade +# \{"revision": "(\d+)"\}', readme)
    assert shown is not None
    assert out(fresh_database_url, "db", "upgrade") == {"revision": shown.group(1)}


def test_scripts_serve_prints_its_json_object_alone_and_needs_no_npm(tmp_path: Path) -> None:
    """The script as a person runs it, with no npm on PATH: stdout's first line is the
    demo's JSON object (bootstrap's output goes to stderr), and GraphiQL's page answers
    on its shipped assets."""
    port = _free_port()
    bin_dir = tmp_path / "bin"  # an npm and a node that fail, first on PATH
    bin_dir.mkdir()
    for tool in ("npm", "node"):
        (bin_dir / tool).write_text("#!/bin/sh\necho no $0 >&2\nexit 127\n")
        (bin_dir / tool).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "BETTERCOMPUTE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/d.db",
    }
    server = subprocess.Popen(
        [str(ROOT / "scripts" / "serve"), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        hints = json.loads(_first_line(server.stdout, 120))
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(hints["graphiql"], headers={"accept": "text/html"})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.1)
        page = httpx.get(hints["graphiql"], headers={"accept": "text/html"})
        assert page.status_code == 200 and "/assets/graphiql@3.8.3/" in page.text
        script = hints["graphiql"].replace("/graphql", "/assets/graphiql@3.8.3/graphiql.min.js")
        assert httpx.get(script).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=10)
        assert server.stdout is not None
        server.stdout.close()
