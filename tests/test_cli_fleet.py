"""`bettercompute apply`/`export` and the fast admin commands, run as an operator would."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import yaml
from alembic import command
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.head import HEAD_REVISION
from app.db.migrate import alembic_config
from tests.test_cli import BIN, out, run

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


@pytest.mark.slow
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


# What no admin command loads: the server, GraphQL, the event relay, Alembic.
HEAVY = ("alembic", "strawberry", "graphql", "starlette", "uvicorn", "broadcaster", "yaml")
HEAVY_APP = ("app.server", "app.rest", "app.events.relay", "app.events.subscribe", "schema")
# What the row writes on an embedded file at head do without (app/db/embedded_rows.py):
# the ORM and its drivers, pydantic and its settings, the event loop.
NOT_FOR_ROWS = (
    "sqlalchemy",
    "aiosqlite",
    "asyncpg",
    "greenlet",
    "pydantic",
    "pydantic_core",
    "pydantic_settings",
    "asyncio",
)
NOT_FOR_ROWS_APP = ("app.config", "app.db.engine", "app.db.models", "app.db.uow")


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


def _among(loaded: list[str], packages: tuple[str, ...], modules: tuple[str, ...]) -> list[str]:
    return [
        m
        for m in loaded
        if m.split(".")[0] in packages or any(m == h or m.startswith(h + ".") for h in modules)
    ]


@pytest.mark.parametrize("dialect", ["sqlite"])
def test_row_writes_on_the_embedded_file_load_no_orm_no_pydantic_no_event_loop(
    tmp_path: Path, dialect: str
) -> None:
    """The import budget of `tenant create` and its kind, by what they load, not by time
    (bench/cli_commands.py prints the times). The file's name needs a URL escape: the
    stdlib must write the very file SQLAlchemy opens."""
    url = f"sqlite+aiosqlite:///{tmp_path}/my%20fleet.db"
    run(url, "db", "upgrade")
    caller = out(url, "caller", "create", "--tenant", "fleet", "--role", "fleet-admin")
    commands = [
        ("tenant", "create", "acme"),
        ("tenant", "create", "acme-lab", "--parent", "acme"),
        ("caller", "create", "--tenant", "acme", "--role", "viewer", "--where", "region=eu"),
        ("site", "create", "--tenant", "acme", "--kind", "custom", "--region", "eu"),
        ("provider-account", "create", "--tenant", "acme"),
        ("token", "create", "--caller", caller["callerId"]),
    ]
    for args in commands:
        loaded = _modules_loaded_by(url, *args)
        assert _among(loaded, HEAVY, HEAVY_APP) == [], args
        assert _among(loaded, NOT_FOR_ROWS, NOT_FOR_ROWS_APP) == [], args
        assert "app.db.embedded_rows" in loaded, args
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["my fleet.db"]
    exported = yaml.safe_load(run(url, "export").stdout)
    assert {"id": "acme-lab", "parent": "acme"} in exported["tenants"]


@pytest.mark.parametrize("dialect", ["sqlite"])
def test_a_row_write_that_cannot_take_the_write_lock_is_unavailable(
    tmp_path: Path, dialect: str
) -> None:
    """The embedded store waits BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS for the lock a
    server's write holds, then answers as the server's store does."""
    path = tmp_path / "busy.db"
    url = f"sqlite+aiosqlite:///{path}"
    run(url, "db", "upgrade")
    env = {
        **os.environ,
        "BETTERCOMPUTE_DATABASE_URL": url,
        "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": "0.2",
    }
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        done = subprocess.run(
            [str(BIN), "tenant", "create", "acme"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        holder.execute("ROLLBACK")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        "bettercompute: UNAVAILABLE: the service is temporarily unavailable; retry"
    )
    assert out(url, "tenant", "create", "acme") == {"tenantId": "acme"}


async def _migrated_to(path: Path, revision: str) -> str:
    """An embedded database at `path` migrated only as far as `revision`; its URL."""
    url = f"sqlite+aiosqlite:///{path}"
    engine = create_async_engine(url, poolclass=NullPool)

    def upgrade(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    try:
        async with engine.begin() as connection:
            await connection.run_sync(upgrade)
    finally:
        await engine.dispose()
    return url


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_an_embedded_database_behind_head_is_migrated_by_any_command(
    tmp_path: Path, dialect: str
) -> None:
    path = tmp_path / "old.db"
    url = await _migrated_to(path, "0002")

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


def test_read_only_commands_write_no_database(tmp_path: Path) -> None:
    """A dry run on a new path plans against an empty fleet and leaves no file; export
    says which database it reads, and refuses to create one."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    missing = tmp_path / "elsewhere" / "bettercompute.db"
    missing.parent.mkdir()
    url = f"sqlite+aiosqlite:///{missing}"

    plan = run(url, "apply", "-f", str(fleet), "--dry-run")
    assert json.loads(plan.stdout)["changes"] == 8 and not missing.exists()
    assert f"database {missing}" in plan.stderr

    refused = run(url, "export", ok=False)
    assert refused.returncode == 1 and not missing.exists()
    assert refused.stderr.splitlines()[-1].startswith(
        f"bettercompute: NOT_FOUND: no database at {missing}"
    )

    out(url, "apply", "-f", str(fleet))
    exported = run(url, "export")
    assert f"database {missing}" in exported.stderr
    assert [p["name"] for p in yaml.safe_load(exported.stdout)["pools"]] == ["h100"]


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_a_dry_run_on_a_file_behind_head_leaves_it_behind(
    tmp_path: Path, dialect: str
) -> None:
    path = tmp_path / "old.db"
    url = await _migrated_to(path, "0004")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)

    plan = out(url, "apply", "-f", str(fleet), "--dry-run")
    assert plan["changes"] == 8
    exported = yaml.safe_load(run(url, "export").stdout)
    assert exported["pools"] == []
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0004",)]
