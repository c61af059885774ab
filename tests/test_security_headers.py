"""Every HTTP answer is nosniff, never framed and, unless it is one of the two pages, runs
nothing if opened as a document (app/security_headers.py); the pages carry their own
policy (tests/test_browser.py checks that they still work under it in Chromium)."""

from __future__ import annotations

import pytest

from tests.support import Api


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "/console", {}),
        ("GET", "/graphql", {"accept": "text/html"}),
        ("POST", "/api/compute/pools/list", {}),
        ("POST", "/graphql", {}),
        ("GET", "/console/static/console.js", {}),
        ("GET", "/nowhere", {}),
        ("GET", "/livez", {}),
    ],
)
async def test_each_answer_carries_the_headers(
    api: Api, method: str, path: str, headers: dict[str, str]
) -> None:
    response = await api.client.request(method, path, headers=headers, json={})
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    csp = response.headers["content-security-policy"]
    assert csp.startswith("default-src 'none'") and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    if response.headers["content-type"].startswith("text/html"):
        assert "script-src 'self'" in csp
    else:
        assert "script-src" not in csp  # nothing runs


def test_graphiqls_policy_names_its_inline_script_and_the_cdn_only_when_used() -> None:
    import base64
    import hashlib
    import re

    from strawberry.http.ides import get_graphql_ide_html

    from schema.graphiql import ASSETS, CDN, graphiql_csp

    html = get_graphql_ide_html(graphql_ide="graphiql")
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    on_cdn, local = graphiql_csp(html), graphiql_csp(html.replace(CDN, ASSETS))
    assert f"'sha256-{digest}'" in on_cdn and f"'sha256-{digest}'" in local
    assert "https://unpkg.com" in on_cdn and "unpkg" not in local
