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
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from app import config_env
from app.db.embedded import at_head, busy_timeout_ms, ensure_migrated, is_embedded, sqlite_file
from app.errors import DomainError, InvalidInput, NotFound

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database
    from app.db.inventory_rows import InventoryRows
    from app.fleet.schema import FleetFile

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


async def _demo(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    from app.demo import base_url, seed

    return await seed(db, base_url(a.host, a.port))


def _read_file(path: str, max_bytes: int) -> bytes:
    """At most one byte past the bound: enough to tell that a file is too large."""
    if path == "-":
        return sys.stdin.buffer.read(max_bytes + 1)
    try:
        with open(path, "rb") as file:
            return file.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", field="file") from None


def _read_fleet(path: str, settings: Settings) -> FleetFile:
    from app.fleet.document import FileBounds
    from app.fleet.schema import read_fleet

    bounds = FileBounds(
        settings.fleet_file_max_bytes,
        settings.fleet_file_max_depth,
        settings.fleet_file_max_alias_nodes,
    )
    return read_fleet(_read_file(path, bounds.max_bytes), path, bounds)


async def _apply(db: Database, a: argparse.Namespace) -> dict[str, Any]:
    from app.fleet.apply import apply_fleet

    return await apply_fleet(db, a.fleet, dry_run=a.dry_run, prune=a.prune)


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


class _Help(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples kept as written (wrapped by `_describe`); an option's
    default shown beside it when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


def _describe(text: str) -> str:
    import textwrap

    return "\n\n".join(textwrap.fill(p, 88, break_on_hyphens=False) for p in text.split("\n\n"))


OVERVIEW = """\
Run and administer the Better Compute pools service: GPU pools that tenants create and
share with other tenants under quotas, served as REST (POST /api/compute/pools/<method>),
GraphQL with live subscriptions (/graphql), and a live console (/console).

Every admin command prints one JSON object on stdout; a failure prints one line,
CODE: message, on stderr and exits 1. The database is $BETTERCOMPUTE_DATABASE_URL
(default sqlite+aiosqlite:///./bettercompute.db, created and migrated on first use;
production: postgresql+asyncpg://user@host/db)."""

GETTING_STARTED = """\
first steps:
  bettercompute serve --demo                     seed a demo fleet, print tokens, serve :8000
  bettercompute tenant create acme
  bettercompute caller create --tenant acme --role admin
  bettercompute apply -f fleet.yaml --dry-run    what a fleet file would change

'bettercompute COMMAND --help' explains each command."""


def _example(*lines: str) -> str:
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


def _parser() -> argparse.ArgumentParser:
    from app.iam.roles import BINDING_ATTRIBUTES, FLEET_ADMIN, FLEET_TENANT, ROLE_PERMISSIONS

    parser = argparse.ArgumentParser(
        prog="bettercompute", description=OVERVIEW, epilog=GETTING_STARTED, formatter_class=_Help
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        summary: str,
        details: str,
        *example: str,
    ) -> argparse.ArgumentParser:
        return parent.add_parser(
            name,
            help=summary,
            description=_describe(f"{summary[0].upper()}{summary[1:]}. {details}".strip()),
            epilog=_example(*example) if example else None,
            formatter_class=_Help,
        )

    def group(name: str, summary: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        return command(sub, name, summary, "").add_subparsers(
            dest="action", required=True, metavar="ACTION"
        )

    serve = command(
        sub,
        "serve",
        "run the API on HOST:PORT",
        "Migrates the embedded SQLite default first; another database is migrated with "
        "'bettercompute db upgrade'. Several processes share events through "
        "$BETTERCOMPUTE_BROADCAST_URL (redis://… or postgres://…).",
        "bettercompute serve --port 8080 --demo",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--workers", type=int, default=1, help="worker processes")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="first seed the demo fleet (once) and print its tokens and a curl for this port",
    )

    db = group("db", "database schema")
    command(
        db,
        "upgrade",
        "migrate the database to the newest schema revision",
        "Safe to run again; prints the revision reached.",
        "BETTERCOMPUTE_DATABASE_URL=postgresql+asyncpg://bc@db/bc bettercompute db upgrade",
    )

    tenant = command(
        group("tenant", "tenants: the organisations that own and use pools"),
        "create",
        "create a tenant",
        "A child tenant (--parent) sees what its ancestors offer to descendants.",
        "bettercompute tenant create acme-research --parent acme",
    )
    tenant.add_argument("id", help="the tenant's id, e.g. acme")
    tenant.add_argument("--parent", help="the parent tenant's id")
    tenant.set_defaults(write=_tenant_create)

    site = command(
        group("site", "sites: where a tenant's pools run"),
        "create",
        "create a site for a tenant",
        "",
        "bettercompute site create --tenant acme --kind platform --region eu-west",
    )
    site.add_argument("--tenant", required=True, help="the owning tenant's id")
    site.add_argument("--kind", required=True, choices=SITE_KINDS, help="the site's kind")
    site.add_argument("--region", required=True, help="the region its pools report")
    site.set_defaults(write=_site_create)

    account = command(
        group("provider-account", "provider accounts: cloud accounts that back pools"),
        "create",
        "create a provider account for a tenant",
        "",
        "bettercompute provider-account create --tenant acme",
    )
    account.add_argument("--tenant", required=True, help="the owning tenant's id")
    account.set_defaults(write=_account_create)

    roles, granted = [], frozenset[str]()
    for role, permissions in ROLE_PERMISSIONS.items():  # each role adds to the one before
        added = sorted(p.removeprefix("compute:") for p in permissions - granted)
        if not added:
            more = "the same, for any tenant"
        else:
            more = f"also {', '.join(added)}" if granted else ", ".join(added)
        roles.append(f"{role} ({more})")
        granted = permissions
    caller = command(
        group("caller", "callers: who calls the API, each with one role in one tenant"),
        "create",
        "create a caller and print its first API token",
        f"Roles: {'; '.join(roles)}. {FLEET_ADMIN} is for callers of the built-in '{FLEET_TENANT}' "
        "tenant and may act for any tenant. --where narrows the role to pools whose "
        f"attributes match ({', '.join(BINDING_ATTRIBUTES)}); repeat it to narrow further. "
        "The token is printed only once.",
        "bettercompute caller create --tenant acme --role viewer --where gpuModel=H100",
    )
    caller.add_argument("--tenant", required=True, help="the caller's tenant")
    caller.add_argument("--role", required=True, help=f"one of {', '.join(ROLE_PERMISSIONS)}")
    caller.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"narrow the role; KEY is one of {', '.join(BINDING_ATTRIBUTES)}",
    )
    caller.set_defaults(write=_caller_create)

    tokens = group("token", "API tokens (Authorization: Bearer …)")
    token_create = command(
        tokens,
        "create",
        "issue another token for a caller",
        "The token is printed only once; the caller's earlier tokens stay valid.",
        "bettercompute token create --caller caller_01j…",
    )
    token_create.add_argument("--caller", required=True, help="the caller's id")
    token_create.set_defaults(write=_token_create)
    token_revoke = command(
        tokens,
        "revoke",
        "revoke a token",
        "Requests with it are refused at once; its open websockets close (4403) within "
        "$BETTERCOMPUTE_REVOCATION_POLL_SECONDS, at once on a shared broker.",
        "bettercompute token revoke --token bct_…",
    )
    token_revoke.add_argument("--token", required=True, help="the token to revoke")
    token_revoke.set_defaults(run=_token_revoke)

    node = command(
        group("node", "nodes: the GPUs behind a pool's capacity"),
        "add",
        "add a node of GPUs to a pool",
        "The pool's capacity grows by --gpus.",
        "bettercompute node add --pool pool_01j… --gpus 8",
    )
    node.add_argument("--pool", required=True, help="the pool's id")
    node.add_argument("--gpus", required=True, type=int, help="GPUs on the node")
    node.add_argument("--owner-tenant", help="the tenant that owns the hardware, if not the pool's")
    node.set_defaults(run=_node_add)

    apply = command(
        sub,
        "apply",
        "make the fleet what a fleet file (YAML or JSON) declares, in one step",
        "Creates what is missing and changes what differs; prints what it did. Nothing is "
        "written with --dry-run. 'bettercompute export' writes a file to start from.",
        "bettercompute apply -f fleet.yaml --dry-run",
    )
    apply.add_argument("-f", "--file", required=True, help="the fleet file, or - for stdin")
    apply.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    apply.add_argument(
        "--prune",
        action="store_true",
        help="also withdraw the offers of the file's pools that no fleet file declared "
        "(made through the API); an offer the file declared before and no longer lists is "
        "withdrawn without it",
    )
    apply.set_defaults(run=_apply, read_only=lambda a: a.dry_run)

    export = command(
        sub,
        "export",
        "print the fleet as a fleet file",
        "Secrets (join tokens, API tokens) are never exported.",
        "bettercompute export > fleet.yaml",
    )
    export.add_argument("--format", choices=("yaml", "json"), default="yaml", help="output")
    export.set_defaults(run=_export, render=_fleet_document, read_only=lambda a: True)

    demo = command(
        sub,
        "demo",
        "seed a small demo fleet (once) and print tokens to try",
        "Running it again keeps the data and prints fresh tokens. 'serve --demo' does this "
        "and serves, with the hints pointing at the port it serves.",
        "bettercompute demo --port 8080",
    )
    demo.add_argument("--host", default="127.0.0.1", help="the server the hints point at")
    demo.add_argument("--port", type=int, default=8000, help="its port")
    demo.set_defaults(run=_demo)
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
        # Read and checked before the database is opened: stdin is read once, and a file
        # past a bound (app/fleet/document.py) is refused having touched nothing.
        args.fleet = _read_fleet(args.file, settings)
    if _read_only(args) and is_embedded(settings.database_url):
        return _read_embedded(args, settings)
    return asyncio.run(_run(args, settings))


def _read_only(args: argparse.Namespace) -> bool:
    decides: Callable[[argparse.Namespace], bool] | None = getattr(args, "read_only", None)
    return decides is not None and decides(args)


def _read_embedded(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """A read-only command (export, a dry run) on the embedded default: it says which file
    it reads and writes none. A file behind head is read from a migrated copy, and so is
    no file at all by a dry run; an export of no file is refused."""
    import asyncio

    from app.db.embedded import scratch_copy

    path = sqlite_file(settings.database_url)
    where = os.path.abspath(path) if path is not None else settings.database_url
    print(f"bettercompute {args.command}: database {where}", file=sys.stderr)
    if at_head(settings.database_url):
        return asyncio.run(_run(args, settings))
    if args.command == "export" and (path is None or not os.path.exists(path)):
        raise NotFound(
            f"no database at {where} (BETTERCOMPUTE_DATABASE_URL): "
            "nothing to export, and export creates none"
        )
    with scratch_copy(settings.database_url) as url:
        return asyncio.run(_run(args, settings.model_copy(update={"database_url": url})))


async def _run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    await ensure_migrated(settings.database_url)  # the embedded default needs no setup step
    return await _on(args, settings)


async def _on(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from app.db.engine import create_database

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

    from app.compat import http_protocol, websocket_protocol
    from app.db.migrate import upgrade
    from app.logs import logging_config

    if _embedded(settings.database_url):
        asyncio.run(upgrade(settings.database_url))
    if args.demo:  # its one JSON object first, naming the port served below
        sys.stdout.write(
            _json_line(
                asyncio.run(_run(argparse.Namespace(**{**vars(args), "run": _demo}), settings)),
                args,
            )
        )
        sys.stdout.flush()
    if args.workers > 1:
        _multiprocess_metrics()
    uvicorn.run(
        "app.server:app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        http=http_protocol(settings),  # PostgreSQL: one write per response (app/http_protocol.py)
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
