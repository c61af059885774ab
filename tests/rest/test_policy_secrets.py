"""Secrets in a pool policy are write-only (CONTRACT section 6): `kubernetes.token` is
stored for the nodes and never read back, by the owner or anyone else, on REST or
GraphQL, in an answer, an error, an outbox row or a log line. Reads show
`"tokenSet": true`; sending that back keeps the stored token (docs/decisions/0001)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import select

from app.db.engine import Database
from app.db.models import Pool
from tests.graphql.documents import METHODS, to_rest, to_variables
from tests.rest.scene import Scene, events, fetch
from tests.support import Api, Fleet

Json = dict[str, Any]

TOKEN = "s3cr3t.j01nt0k3nv4lue"
HASH = "sha256:" + "ab" * 32
JOIN_SET: Json = {
    "apiServer": "https://k8s.example.com:6443",
    "token": TOKEN,
    "caCertHash": HASH,
    "labels": {"team": "ml"},
}
SHOWN: Json = {
    "apiServer": "https://k8s.example.com:6443",
    "tokenSet": True,
    "caCertHash": HASH,
    "labels": {"team": "ml"},
}


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record at every level, SQL statements included, to grep for the token."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")  # off by default
    yield caplog


@dataclass
class Surface:
    """One transport: REST, or GraphQL with the same bodies as variables. Keeps every
    answer's raw text."""

    api: Api
    transport: str
    texts: list[str] = field(default_factory=list)

    async def call(self, token: str, method: str, body: Json) -> Json:
        if self.transport == "rest":
            response = await self.api.post(token, f"pools/{method}", body)
            self.texts.append(response.text)
            assert response.status_code == 200, response.text
            answer: Json = response.json()
            return answer
        document = METHODS[method][0]
        response = await self.api.client.post(
            "/graphql",
            json={"query": document, "variables": to_variables(method, body)},
            headers={"authorization": f"Bearer {token}"},
        )
        self.texts.append(response.text)
        result = response.json()
        # `offers` answers null with an error for a caller that may not read them.
        assert all(e["path"][-1] == "offers" for e in result.get("errors", [])), result
        return to_rest(method, result["data"])

    async def refused(self, token: str, method: str, body: Json) -> str:
        """A call that must fail: its error's raw text."""
        if self.transport == "rest":
            response = await self.api.post(token, f"pools/{method}", body)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["code"] == "INVALID_INPUT"
        else:
            response = await self.api.client.post(
                "/graphql",
                json={"query": METHODS[method][0], "variables": to_variables(method, body)},
                headers={"authorization": f"Bearer {token}"},
            )
            errors = response.json()["errors"]
            assert [e["extensions"]["code"] for e in errors] == ["INVALID_INPUT"], errors
        self.texts.append(response.text)
        return response.text


@pytest.fixture(params=["rest", "graphql"])
def surface(request: pytest.FixtureRequest, api: Api) -> Surface:
    return Surface(api, str(request.param))


async def stored_policy(db: Database, pool_id: str) -> Json:
    rows = await fetch(db, select(Pool.policy).where(Pool.id == pool_id))
    policy: Json = dict(rows[0].policy)
    return policy


async def test_a_join_token_is_never_read_back(
    surface: Surface, fleet: Fleet, db: Database, logs: pytest.LogCaptureFixture
) -> None:
    s = await Scene.start(surface.api, fleet)
    beta = await s.guest("beta")
    beta_dev = await s.guest("beta-dev", parent="beta", role="viewer")
    viewer = await fleet.caller("acme", "viewer")

    def pool_of(tenant: str, pool_id: str) -> Json:
        return {"tenantId": tenant, "poolId": pool_id}

    created = await surface.call(
        s.token,
        "create",
        {"tenantId": "acme", "siteId": s.site, "class": "metal-host", "gpuModel": "H100"}
        | {"policy": {"kubernetes": JOIN_SET}},
    )
    pool_id = created["pool"]["id"]
    offered = await surface.call(
        s.token,
        "offer",
        pool_of("acme", pool_id)
        | {"toTenantId": "beta", "quota": {"gpu": 2}}
        | {"includeDescendants": True},
    )
    answers = [
        created,
        offered,  # as beta sees it
        await surface.call(s.token, "get", pool_of("acme", pool_id)),
        await surface.call(viewer, "get", pool_of("acme", pool_id)),
        await surface.call(beta, "get", pool_of("beta", pool_id)),
        await surface.call(beta_dev, "get", pool_of("beta-dev", pool_id)),
        await surface.call(s.token, "update", pool_of("acme", pool_id) | {"gpuModel": "A100"}),
    ]
    listed = [
        await surface.call(token, "list", {"tenantId": tenant})
        for token, tenant in ((s.token, "acme"), (beta, "beta"), (beta_dev, "beta-dev"))
    ]
    for answer in answers:
        assert answer["pool"]["policy"] == {"kubernetes": SHOWN}
    for answer in listed:
        assert [p["policy"] for p in answer["pools"]] == [{"kubernetes": SHOWN}]

    # The client edits what it read and sends it back: the stored token stays.
    edited = {"kubernetes": {**SHOWN, "labels": {"team": "infra"}}}
    updated = await surface.call(s.token, "update", pool_of("acme", pool_id) | {"policy": edited})
    assert updated["pool"]["policy"] == edited
    archived = await surface.call(s.token, "archive", pool_of("acme", pool_id))
    assert archived["pool"]["policy"] == edited

    # Stored for the nodes, shown nowhere: no answer, outbox row or log line holds it.
    assert (await stored_policy(db, pool_id))["kubernetes"] == {
        **JOIN_SET,
        "labels": {"team": "infra"},
    }
    assert len(surface.texts) == 12
    assert not [text for text in surface.texts if TOKEN in text]
    written = await events(db, pool_id)
    assert len(written) == 5
    assert TOKEN not in json.dumps([e.data for e in written])
    assert any(r.name.startswith("sqlalchemy.engine") for r in logs.records)  # it captures
    assert TOKEN not in logs.text


async def test_a_refused_write_never_echoes_the_token(
    surface: Surface, fleet: Fleet, logs: pytest.LogCaptureFixture
) -> None:
    s = await Scene.start(surface.api, fleet)
    create = {"tenantId": "acme", "siteId": s.site, "class": "metal-host"}
    pool_id = (await surface.call(s.token, "create", create))["pool"]["id"]
    update = {"tenantId": "acme", "poolId": pool_id}
    bad_policies: list[Json] = [
        {"kubernetes": {**JOIN_SET, "caCertHash": "sha1:00"}},
        {"kubernetes": {**JOIN_SET, "apiServer": "http://k8s.example.com"}},
        {"kubernetes": {**JOIN_SET, "labels": {"kubernetes.io/role": "x"}}},
        {"kubernetes": {**JOIN_SET, "tokenSet": "yes"}},
        {"kubernetes": {**JOIN_SET, "kubeconfig": TOKEN}},
        {"kubernetes": {**JOIN_SET, "token": TOKEN + " "}},
        {"kubernetes": JOIN_SET, "hugepages": {"3Mi": 1}},
        {"kubernetes": JOIN_SET},  # platform site without platformOperated, below
    ]
    platform = await s.fleet.site("acme", kind="platform")
    for policy in bad_policies[:-1]:
        await surface.refused(s.token, "create", create | {"policy": policy})
        await surface.refused(s.token, "update", update | {"policy": policy})
    await surface.refused(s.token, "create", create | {"siteId": platform, "policy": JOIN_SET})
    # Schema errors (GraphQL: variable coercion) next to a token.
    await surface.refused(
        s.token, "create", create | {"policy": {"kubernetes": JOIN_SET}, "color": "red"}
    )
    await surface.refused(
        s.token, "update", update | {"policy": {"kubernetes": JOIN_SET}, "gpuModel": "H 100"}
    )
    assert len(surface.texts) == 1 + 2 * 7 + 3
    assert not [text for text in surface.texts if TOKEN in text]
    assert TOKEN not in logs.text


@pytest.mark.parametrize("transport", ["rest", "graphql"])
async def test_what_an_update_does_with_the_stored_token(
    api: Api, fleet: Fleet, db: Database, transport: str
) -> None:
    """docs/decisions/0001: a `kubernetes` with `tokenSet: true` and no `token` keeps the
    stored token (INVALID_INPUT when none is stored, or when apiServer or caCertHash
    changed); a new `token` replaces it; a policy without `kubernetes` removes it."""
    surface = Surface(api, transport)
    s = await Scene.start(api, fleet)
    body = {"tenantId": "acme", "siteId": s.site, "class": "metal-host"}
    pool_id = (await surface.call(s.token, "create", body | {"policy": {"kubernetes": JOIN_SET}}))[
        "pool"
    ]["id"]
    update = {"tenantId": "acme", "poolId": pool_id}

    async def token_stored() -> str | None:
        kubernetes = (await stored_policy(db, pool_id)).get("kubernetes", {})
        return kubernetes.get("token")  # type: ignore[no-any-return]

    async def refused_on(policy: Json) -> str:
        text = await surface.refused(s.token, "update", update | {"policy": policy})
        return text

    # Refused, and nothing changes: a kept token goes only to the server and CA it was for.
    moved = await refused_on({"kubernetes": {**SHOWN, "apiServer": "https://evil.example"}})
    assert "policy.kubernetes.token" in moved
    await refused_on({"kubernetes": {**SHOWN, "caCertHash": "sha256:" + "cd" * 32}})
    await refused_on({"kubernetes": {**SHOWN, "tokenSet": 1}})
    version = (await surface.call(s.token, "get", update))["pool"]["version"]
    assert version == 1 and await token_stored() == TOKEN

    # Kept.
    kept = await surface.call(s.token, "update", update | {"policy": {"kubernetes": SHOWN}})
    assert kept["pool"]["policy"] == {"kubernetes": SHOWN}
    assert await token_stored() == TOKEN
    # Replaced, with or without the marker beside it.
    for sent in ({**SHOWN, "token": "n3w.t0k3n"}, {**JOIN_SET, "token": "n3w3r.t0k3n"}):
        replaced = await surface.call(s.token, "update", update | {"policy": {"kubernetes": sent}})
        assert replaced["pool"]["policy"] == {"kubernetes": SHOWN}
        assert await token_stored() == sent["token"]
    # Removed with the key; then there is nothing to keep.
    removed = await surface.call(s.token, "update", update | {"policy": {"singleTenant": False}})
    assert removed["pool"]["policy"] == {"singleTenant": False}
    assert await token_stored() is None
    nothing = await refused_on({"kubernetes": SHOWN})
    assert "policy.kubernetes.tokenSet" in nothing
    # Nor on create.
    await surface.refused(s.token, "create", body | {"policy": {"kubernetes": SHOWN}})
    assert not [text for text in surface.texts if TOKEN in text or "n3w" in text]
