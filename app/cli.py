"""The `bettercompute` operator command. Each admin command prints one JSON object on
stdout, or a one-line error on stderr with a non-zero exit.

Only argparse and small modules are imported up front: each command imports what it
needs when it runs, so an admin command answers like a shell command (the server, GraphQL
and the event relay load only for `serve`, Alembic only when the database is behind;
bench/cli_commands.py). The commands that create tenants, sites, provider accounts,
callers and tokens run the domain's rules on the embedded SQLite file through the stdlib
`sqlite3` when the file is at head (app/db/embedded_rows.py): no SQLAlchemy, no
pydantic-settings (app/config_env.py), no asyncio. On any other database they run the
same rules in a unit of work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from app import config_env
from app.db.embedded import at_head, busy_timeout_ms, ensure_migrated, is_embedded, sqlite_file
from app.errors import DomainError, InvalidInput

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database
    from app.db.inventory_rows import InventoryRows

# A command that checks and adds inventory rows through the domain (app/db/inventory_rows.py):
# on an embedded file at head it runs on the stdlib's sqlite3, elsewhere in a unit of work.
Write = Callable[["InventoryRows", argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]
# Any other command, on the database's engines.
Command = Callable[["Database", argparse.Namespace], Awaitable[dict[str, Any]]]
SITE_KINDS = ("platform", "custom")  # app.capacity.inventory checks them; listed for --help


def _where(pairs: Sequence[str]) -> dict[str, str]:
    conditions: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--where takes KEY=VALUE, not {pair!r}", field="where")
        conditions[key] = value
    return conditions


async def _tenant_create(rows: InventoryRows, a: argparse.Namespace) -> dict[str, Any]:
    from app.capacity.inventory import add_tenant

    return {"tenantId": await add_tenant(rows, a.id, a.parent)}


async def _site_create(rows: InventoryRows, a: argparse.Namespace) -> dict[str, Any]:
    from app.capacity.inventory import add_site

    return {"siteId": await add_site(rows, a.tenant, a.kind, a.region)}


async def _account_create(rows: InventoryRows, a: argparse.Namespace) -> dict[str, Any]:
    from app.capacity.inventory import add_provider_account

    return {"providerAccountId": await add_provider_account(rows, a.tenant)}


async def _caller_create(rows: InventoryRows, a: argparse.Namespace) -> dict[str, Any]:
    from app.iam.issuing import add_caller

    caller_id, token = await add_caller(rows, a.tenant, a.role, _where(a.where))
    return {"callerId": caller_id, "token": token}


async def _token_create(rows: InventoryRows, a: argparse.Namespace) -> dict[str, Any]:
    from app.iam.issuing import add_token

    return {"token": await add_token(rows, a.caller)}


async def _token_revoke(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    from app.config import Settings
    from app.events.bus import announce_revocation
    from app.iam import callers

    if await callers.revoke_token(db, a.token):
        # Serve processes on a shared broker close the token's websockets at once; the
        # others find it within BETTERCOMPUTE_REVOCATION_POLL_SECONDS.
        await announce_revocation(Settings.from_env().broadcast_url)
    return {"revoked": True}


async def _node_add(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    from app.capacity.nodes import add_node

    return {"nodeId": await add_node(db, a.pool, a.gpus, a.owner_tenant)}


async def _demo(db: Database, _: argparse.Namespace) -> dict[str, Any]:
    from app.demo import seed

    return await seed(db)


def _read_file(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", field="file") from None


async def _apply(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    from app.fleet.apply import apply_fleet
    from app.fleet.schema import read_fleet

    return await apply_fleet(db, read_fleet(a.text, a.file), dry_run=a.dry_run)


async def _export(db: Database, _: argparse.Namespace) -> dict[str, Any]:
    from app.fleet.export import export_fleet

    return await export_fleet(db)


def _json_line(result: dict[str, Any], _: argparse.Namespace) -> str:
    import orjson

    return orjson.dumps(result).decode() + "\n"


def _fleet_document(result: dict[str, Any], a: argparse.Namespace) -> str:
    if a.format == "json":
        import orjson

        return orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n"
    import yaml

    return str(yaml.safe_dump(result, sort_keys=False, allow_unicode=True))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bettercompute", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API (migrates the embedded default first)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)

    db = sub.add_parser("db", help="schema migrations").add_subparsers(dest="action", required=True)
    db.add_parser("upgrade", help="migrate the database to the newest revision")

    def group(name: str, help_text: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        return sub.add_parser(name, help=help_text).add_subparsers(dest="action", required=True)

    tenant = group("tenant", "tenants").add_parser("create")
    tenant.add_argument("id")
    tenant.add_argument("--parent")
    tenant.set_defaults(write=_tenant_create)

    site = group("site", "sites").add_parser("create")
    site.add_argument("--tenant", required=True)
    site.add_argument("--kind", required=True, choices=SITE_KINDS)
    site.add_argument("--region", required=True)
    site.set_defaults(write=_site_create)

    account = group("provider-account", "provider accounts").add_parser("create")
    account.add_argument("--tenant", required=True)
    account.set_defaults(write=_account_create)

    caller = group("caller", "callers and their first token").add_parser("create")
    caller.add_argument("--tenant", required=True)
    caller.add_argument("--role", required=True)
    caller.add_argument("--where", action="append", default=[], metavar="KEY=VALUE")
    caller.set_defaults(write=_caller_create)

    tokens = group("token", "API tokens")
    token_create = tokens.add_parser("create")
    token_create.add_argument("--caller", required=True)
    token_create.set_defaults(write=_token_create)
    token_revoke = tokens.add_parser("revoke")
    token_revoke.add_argument("--token", required=True)
    token_revoke.set_defaults(run=_token_revoke)

    node = group("node", "nodes").add_parser("add")
    node.add_argument("--pool", required=True)
    node.add_argument("--gpus", required=True, type=int)
    node.add_argument("--owner-tenant")
    node.set_defaults(run=_node_add)

    apply = sub.add_parser(
        "apply", help="make the fleet what a fleet file (YAML or JSON) declares, in one step"
    )
    apply.add_argument("-f", "--file", required=True, help="the fleet file, or - for stdin")
    apply.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    apply.set_defaults(run=_apply)

    export = sub.add_parser("export", help="print the fleet as a fleet file (no secrets)")
    export.add_argument("--format", choices=("yaml", "json"), default="yaml")
    export.set_defaults(run=_export, render=_fleet_document)

    sub.add_parser("demo", help="seed a small fleet and print tokens").set_defaults(run=_demo)
    return parser


def _embedded(url: str) -> bool:
    return is_embedded(url)


def _embedded_target(args: argparse.Namespace) -> tuple[str, int] | None:
    """(file, busy timeout in ms) when `args` writes inventory rows and the database is an
    embedded file at head: then neither SQLAlchemy nor pydantic-settings is needed."""
    if getattr(args, "write", None) is None:
        return None
    url = config_env.database_url()
    path = sqlite_file(url)
    timeout_s = config_env.db_statement_timeout_s()
    if path is None or timeout_s is None or not at_head(url):
        return None
    return path, busy_timeout_ms(timeout_s)


def _write_embedded(args: argparse.Namespace, path: str, busy_timeout: int) -> dict[str, Any]:
    from app.db.embedded_rows import write_embedded

    write: Write = args.write
    return write_embedded(path, busy_timeout, lambda rows: write(rows, args))


def _with_database(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    import asyncio

    if args.command == "db":
        from app.db.migrate import upgrade

        return {"revision": asyncio.run(upgrade(settings.database_url))}
    if args.command == "apply":
        args.text = _read_file(args.file)  # before the database, so stdin is read once
    return asyncio.run(_run(args, settings))


async def _run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from app.db.engine import create_database

    await ensure_migrated(settings.database_url)  # the embedded default needs no setup step
    db = create_database(settings.database_url, settings)
    try:
        write: Write | None = getattr(args, "write", None)
        if write is None:
            command: Command = args.run
            return await command(db, args)
        from app.db.uow import UnitOfWork

        async with UnitOfWork(db) as uow:
            return await write(uow.rows, args)
    finally:
        await db.dispose()


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    import uvicorn

    from app.compat import websocket_protocol
    from app.db.migrate import upgrade
    from app.logs import logging_config

    if _embedded(settings.database_url):
        asyncio.run(upgrade(settings.database_url))
    if args.workers > 1:
        _multiprocess_metrics()
    uvicorn.run(
        "app.server:app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        # websockets-sansio, lighter per idle connection on the fast path (app/compat.py)
        ws=websocket_protocol(settings),
        # Websocket pings find dead peers of both subscription protocols; no per-message
        # compression: events are small, and each connection's zlib state would cost
        # ~100 KB (docs/events.md).
        ws_ping_interval=settings.keepalive_interval_s,
        ws_ping_timeout=settings.keepalive_interval_s,
        ws_per_message_deflate=False,
        ws_max_size=settings.websocket_max_message_bytes,  # a larger message closes 1009
        # uvicorn's default (5 s) equals httpx's keep-alive expiry: a request sent as the
        # server closed the idle connection got no answer, and no log line (issue 19).
        timeout_keep_alive=settings.http_keepalive_s,
        log_config=logging_config(settings),  # JSON lines with request ids (app/logs.py)
        access_log=False,  # app/observe.py logs each request, with more than uvicorn's line
    )
    return 0


def _multiprocess_metrics() -> None:
    """Workers write their metrics to files in one directory, so `/metrics` on any of
    them reports the whole server (prometheus-client's multiprocess mode). Set before the
    workers start: prometheus-client reads it when first imported. A directory the
    operator names is used as it is; otherwise a fresh one per `serve`."""
    import os
    import tempfile

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="bettercompute-metrics-")


def _fail(message: str) -> int:
    print(f"bettercompute: {message}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    target = _embedded_target(args)
    if target is not None:
        return _answer(args, lambda: _write_embedded(args, *target))
    from app.config import Settings

    settings = Settings.from_env()
    if args.command == "serve":
        return _answer(args, lambda: _serve(args, settings))
    return _answer(args, lambda: _with_database(args, settings))


def _answer(args: argparse.Namespace, outcome: Callable[[], dict[str, Any] | int]) -> int:
    """Print the command's result (`serve` returns its exit status), or its error as one
    line."""
    try:
        result = outcome()
    except DomainError as exc:
        return _fail(f"{exc.code}: {exc.message}")
    except Exception as exc:
        from app.db.errors import to_domain_error

        error = to_domain_error(exc)
        return _fail(f"{error.code}: {error.message}")
    if isinstance(result, int):
        return result
    sys.stdout.write(getattr(args, "render", _json_line)(result, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
