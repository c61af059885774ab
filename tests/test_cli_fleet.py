"""`bettercompute apply`/`export` and the fast admin commands, run as an operator would."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from alembic import command
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.head import HEAD_REVISION
from app.db.migrate import alembic_config
from tests.test_cli import out, run

FLEET = """
tenants:
  - {id: acme}
  - {id: globex}
  - {id: globex-lab, parent: globex}
sites:
  - {tenant: acme, name: eu, kind: platform, region: eu-west}
callers:
  - {tenant: fleet, name: root, role: fleet-admin}
  - {tenant: acme, name: acme-admin, role: admin}
pools:
  - tenant: acme
    name: h100
    site: eu
    class: metal-host
    gpuModel: H100
    quota: {gpu: 64}
    offers:
      - {tenant: globex, quota: {gpu: 16}, includeDescendants: true, priority: 10}
"""


def test_apply_export_round_trip_dry_run_and_a_bad_file(
    fresh_database_url: str, tmp_path: Path
) -> None:
    url = fresh_database_url
    run(url, "db", "upgrade")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)

    first = out(url, "apply", "-f", str(fleet))
    assert first["changes"] == 8 and first["changed"] == []
    tokens = [e["token"] for e in first["created"] if e["kind"] == "caller"]
    assert len(tokens) == 2 and all(t.startswith("bct_") for t in tokens)
    second = out(url, "apply", "-f", str(fleet))
    assert second["changes"] == 0 and second["summary"].startswith("no changes")

    exported = run(url, "export").stdout
    assert "bct_" not in exported
    piped = json.loads(run(url, "apply", "-f", "-", stdin=exported).stdout)  # export | apply
    assert piped["changes"] == 0, piped
    as_json = tmp_path / "fleet.json"
    as_json.write_text(run(url, "export", "--format", "json").stdout)
    assert out(url, "apply", "-f", str(as_json))["changes"] == 0

    changed = yaml.safe_load(FLEET)
    changed["pools"][0]["offers"] = []
    changed["pools"][0]["quota"] = {"gpu": 32}
    fleet.write_text(yaml.safe_dump(changed))
    plan = out(url, "apply", "-f", str(fleet), "--dry-run")
    assert plan["dryRun"] is True and plan["changes"] == 2
    assert [(e["kind"], e["action"]) for e in plan["changed"]] == [
        ("pool", "update"),
        ("offer", "unoffer"),
    ]
    assert run(url, "export").stdout == exported

    changed["pools"][0]["quota"] = {"gpu": -1}
    fleet.write_text(yaml.safe_dump(changed))
    done = run(url, "apply", "-f", str(fleet), ok=False)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr == (
        "bettercompute: INVALID_INPUT: pools[0].quota.gpu: must be a non-negative integer\n"
    )
    assert run(url, "export").stdout == exported

    applied = out(url, "apply", "-f", str(as_json))
    assert applied["changes"] == 0


def test_a_file_that_cannot_be_read_or_parsed_is_one_line(
    fresh_database_url: str, tmp_path: Path
) -> None:
    url = fresh_database_url
    broken = tmp_path / "broken.yaml"
    broken.write_text("tenants: [\n")
    for args in (("-f", str(tmp_path / "missing.yaml")), ("-f", str(broken))):
        done = run(url, "apply", *args, ok=False)
        assert done.returncode != 0 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("bettercompute: INVALID_INPUT: ")


# What an admin command must not load: the server, GraphQL, the event relay, Alembic.
HEAVY = ("alembic", "strawberry", "graphql", "starlette", "uvicorn", "broadcaster", "yaml")
HEAVY_APP = ("app.server", "app.rest", "app.events.relay", "app.events.subscribe", "schema")


def _modules_loaded_by(url: str, *args: str) -> list[str]:
    script = (
        "import json, sys\n"
        "from app.cli import main\n"
        f"code = main({list(args)!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "BETTERCOMPUTE_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize("dialect", ["sqlite"])
def test_admin_commands_load_neither_the_server_nor_alembic(tmp_path: Path, dialect: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/fleet.db"
    run(url, "db", "upgrade")
    for args in (
        ("tenant", "create", "acme"),
        ("caller", "create", "--tenant", "acme", "--role", "admin"),
        ("site", "create", "--tenant", "acme", "--kind", "custom", "--region", "eu"),
    ):
        loaded = _modules_loaded_by(url, *args)
        heavy = [
            m
            for m in loaded
            if m.split(".")[0] in HEAVY or any(m == h or m.startswith(h + ".") for h in HEAVY_APP)
        ]
        assert heavy == [], args


def _stamp_0002(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "0002")


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_an_embedded_database_behind_head_is_migrated_by_any_command(
    tmp_path: Path, dialect: str
) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite+aiosqlite:///{path}"
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_stamp_0002)
    finally:
        await engine.dispose()

    assert out(url, "tenant", "create", "acme") == {"tenantId": "acme"}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (HEAD_REVISION,)
        ]


def test_the_cli_lists_the_domains_site_kinds_and_tenant_pattern() -> None:
    """Written twice so `--help` and `tenant create` need no domain imports; kept equal."""
    import typing

    from app import cli
    from app.capacity import inventory
    from app.capacity.inputs import TenantId

    assert cli.SITE_KINDS == inventory.SITE_KINDS
    constraint = typing.get_args(TenantId)[1]
    assert f"^{inventory.TENANT_ID.pattern}$" == constraint.pattern
