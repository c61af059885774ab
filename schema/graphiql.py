"""GraphiQL with no internet access: strawberry's page (schema/graphiql.html, with a
labeled token field, the schema refetched when the token or headers change, and an example
dashboard query), its CDN URLs pointed at `/assets/`, which serves the same pinned files
from schema/graphiql_assets/: copies of web/node_modules' files (web/package-lock.json's
versions), committed and packaged, so every installation works offline
(scripts/graphiql-assets regenerates them). The page keeps its subresource-integrity
hashes, so the browser checks that each local file is the exact pinned build. Licences are
served beside them: `/assets/<package>@<version>/LICENSE`."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response

logger = logging.getLogger(__name__)

CDN = "https://unpkg.com/"
ASSETS = "/assets/"
# Laid out like node_modules (<package>/package.json and the served files): the setting
# `web_assets_dir` may point at a node_modules instead.
DEFAULT_ASSETS_DIR = Path(__file__).resolve().parent / "graphiql_assets"
TEMPLATE = Path(__file__).resolve().parent / "graphiql.html"
_ASSET_URL = re.compile(r"https://unpkg\.com/((?:@[\w.-]+/)?[\w.-]+)@([\w.-]+)/([\w./-]+)")


def graphiql_html(assets_dir: str) -> str:
    """The page on local assets when every pinned package is installed; otherwise
    the page on the CDN (a `web_assets_dir` without them), which still works with internet
    access."""
    html = _template()
    root = _root(assets_dir)
    packages = {(package, version) for package, version, _ in served_files()}
    if all(_installed_version(root / package) == version for package, version in packages):
        return html.replace(CDN, ASSETS)
    logger.warning("GraphiQL's assets are not installed under %s: its page uses the CDN", root)
    return html


@dataclass(frozen=True, slots=True)
class GraphiQLPage:
    html: str
    headers: Mapping[str, str]


def graphiql_page(assets_dir: str) -> GraphiQLPage:
    """The page and its Content-Security-Policy."""
    html = graphiql_html(assets_dir)
    return GraphiQLPage(html, {"content-security-policy": graphiql_csp(html)})


# The page's own inline script and style (strawberry's, byte for byte): allowed by hash.
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def graphiql_csp(html: str) -> str:
    """Only what the page loads: its pinned scripts and styles from /assets/ (or the CDN,
    when they are not installed), its inline script and style by their SHA-256, images
    and fonts inlined as data: URLs (the icon, GraphiQL's stylesheet), and requests and
    the websocket to this origin."""
    inline: dict[str, list[str]] = {"script": [], "style": []}
    for tag, body in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        inline[tag].append(f"'sha256-{digest}'")
    origins = " ".join(["'self'", *([CDN.rstrip("/")] if CDN in html else [])])
    return (
        f"default-src 'none'; script-src {origins} {' '.join(inline['script'])}; "
        f"style-src {origins} {' '.join(inline['style'])}; img-src 'self' data:; "
        f"font-src {origins} data:; connect-src 'self'; "
        "base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
    )


def _root(assets_dir: str) -> Path:
    return Path(assets_dir) if assets_dir else DEFAULT_ASSETS_DIR


@cache
def served_files() -> frozenset[tuple[str, str, str]]:
    """(package, version, path) of every file GraphiQL's page loads, and each package's
    licence: nothing else under node_modules is served."""
    files = set(_ASSET_URL.findall(_template()))
    for package, version in {(p, v) for p, v, _ in files}:
        files.add((package, version, "LICENSE"))
    return frozenset(files)


@cache
def _template() -> str:
    return TEMPLATE.read_text()


def assets_endpoint(assets_dir: str) -> Callable[[Request], Awaitable[Response]]:
    root = _root(assets_dir)

    async def assets(request: Request) -> Response:
        package, _, rest = request.path_params["path"].partition("@")
        if package == "" and rest.count("@") == 1:  # a scoped package: @scope/name@version
            scope_name, _, rest = rest.partition("@")
            package = "@" + scope_name
        version, _, path = rest.partition("/")
        if (package, version, path) not in served_files():
            return PlainTextResponse("not found", status_code=404)
        package_dir = root / package
        installed = _installed_version(package_dir)
        if installed != version:  # never serve another build under a pinned URL
            return PlainTextResponse(
                f"{package}@{version} is not installed (run scripts/web-assets)", status_code=404
            )
        file = package_dir / path
        if path == "LICENSE" and not file.exists():
            file = package_dir / "package.json"  # its `license` field, when no file ships
        return FileResponse(file, headers={"cache-control": "public, max-age=31536000, immutable"})

    return assets


def _installed_version(package_dir: Path) -> str | None:
    try:
        version = json.loads((package_dir / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None
