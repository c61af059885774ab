"""The `bettercompute` operator command. Each admin command prints one JSON object on
stdout, or a one-line error on stderr with a non-zero exit."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from sqlalchemy.engine import make_url

from app.capacity import inventory
from app.capacity.errors import DomainError, InvalidInput
from app.config import Settings
from app.db.engine import Database, create_database
from app.db.errors import to_domain_error
from app.db.migrate import upgrade
from app.iam import callers

Command = Callable[[Database, argparse.Namespace], Awaitable[dict[str, Any]]]


def _where(pairs: Sequence[str]) -> dict[str, str]:
    conditions: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--where takes KEY=VALUE, not {pair!r}", field="where")
        conditions[key] = value
    return conditions


async def _tenant_create(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    return {"tenantId": await inventory.create_tenant(db, a.id, a.parent)}


async def _site_create(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    return {"siteId": await inventory.create_site(db, a.tenant, a.kind, a.region)}


async def _account_create(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    return {"providerAccountId": await inventory.create_provider_account(db, a.tenant)}


async def _caller_create(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    caller_id, token = await callers.create_caller(db, a.tenant, a.role, _where(a.where))
    return {"callerId": caller_id, "token": token}


async def _token_create(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    return {"token": await callers.create_token(db, a.caller)}


async def _token_revoke(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    await callers.revoke_token(db, a.token)
    return {"revoked": True}


async def _node_add(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    return {"nodeId": await inventory.add_node(db, a.pool, a.gpus, a.owner_tenant)}


async def _demo(db: Database, _: argparse.Namespace) -> dict[str, Any]:
    from app.demo import seed

    return await seed(db)


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
    tenant.set_defaults(run=_tenant_create)

    site = group("site", "sites").add_parser("create")
    site.add_argument("--tenant", required=True)
    site.add_argument("--kind", required=True, choices=inventory.SITE_KINDS)
    site.add_argument("--region", required=True)
    site.set_defaults(run=_site_create)

    account = group("provider-account", "provider accounts").add_parser("create")
    account.add_argument("--tenant", required=True)
    account.set_defaults(run=_account_create)

    caller = group("caller", "callers and their first token").add_parser("create")
    caller.add_argument("--tenant", required=True)
    caller.add_argument("--role", required=True)
    caller.add_argument("--where", action="append", default=[], metavar="KEY=VALUE")
    caller.set_defaults(run=_caller_create)

    tokens = group("token", "API tokens")
    token_create = tokens.add_parser("create")
    token_create.add_argument("--caller", required=True)
    token_create.set_defaults(run=_token_create)
    token_revoke = tokens.add_parser("revoke")
    token_revoke.add_argument("--token", required=True)
    token_revoke.set_defaults(run=_token_revoke)

    node = group("node", "nodes").add_parser("add")
    node.add_argument("--pool", required=True)
    node.add_argument("--gpus", required=True, type=int)
    node.add_argument("--owner-tenant")
    node.set_defaults(run=_node_add)

    sub.add_parser("demo", help="seed a small fleet and print tokens").set_defaults(run=_demo)
    return parser


def _embedded(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


async def _run(command: Command, args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    if _embedded(settings.database_url):
        await upgrade(settings.database_url)  # the embedded default needs no setup step
    db = create_database(settings.database_url, settings)
    try:
        return await command(db, args)
    finally:
        await db.dispose()


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from app.logs import logging_config
    from app.websocket_protocol import LeanWebSocketProtocol

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
        ws=LeanWebSocketProtocol,  # websockets-sansio, lighter per idle connection
        # Websocket pings find dead peers of both subscription protocols; no per-message
        # compression: events are small, and each connection's zlib state would cost
        # ~100 KB (docs/events.md).
        ws_ping_interval=settings.keepalive_interval_s,
        ws_ping_timeout=settings.keepalive_interval_s,
        ws_per_message_deflate=False,
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
    settings = Settings.from_env()
    try:
        if args.command == "serve":
            return _serve(args, settings)
        if args.command == "db":
            result: dict[str, Any] = {"revision": asyncio.run(upgrade(settings.database_url))}
        else:
            result = asyncio.run(_run(args.run, args, settings))
    except DomainError as exc:
        return _fail(f"{exc.code}: {exc.message}")
    except Exception as exc:
        error = to_domain_error(exc)
        return _fail(f"{error.code}: {error.message}")
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
