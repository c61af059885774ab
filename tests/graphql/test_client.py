"""A real GraphQL client (gql over HTTP, against the ASGI app) drives a dashboard query
and every mutation, checking its documents against the schema it fetches by introspection."""

from __future__ import annotations

from typing import Any

import httpx
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from gql.transport.httpx import HTTPXAsyncTransport
from starlette.applications import Starlette

from tests.graphql.documents import DASHBOARD, pool_mutation
from tests.support import Fleet


def client(app: Starlette, token: str) -> Client:
    transport = HTTPXAsyncTransport(
        url="http://testserver/graphql",
        transport=httpx.ASGITransport(app=app),
        headers={"authorization": f"Bearer {token}"},
    )
    return Client(transport=transport, fetch_schema_from_transport=True)


async def test_dashboard_query_and_every_mutation(app: Starlette, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    await fleet.tenant("beta")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    guest = await fleet.caller("beta", "operator")

    async with client(app, admin) as owner:

        async def run(document: str, **variables: Any) -> Any:
            return await owner.execute(GraphQLRequest(document, variable_values=variables))

        created = await run(
            pool_mutation("createPool", "CreatePoolInput"),
            input={
                "tenantId": "acme",
                "siteId": site,
                "class": "METAL_HOST",
                "gpuModel": "H100",
                "ownerQuota": [{"resource": "gpu", "max": 64}],
            },
        )
        pool = created["createPool"]["pool"]
        assert (pool["version"], pool["sharing"], pool["agent"]) == (1, "EXCLUSIVE", "BCD")
        await fleet.node(pool["id"], 8)

        offered = await run(
            "mutation($input: OfferPoolInput!) { offerPool(input: $input) "
            "{ pool { id owned quotas { resource max used } } } }",
            input={
                "tenantId": "acme",
                "poolId": pool["id"],
                "toTenantId": "beta",
                "quota": [{"resource": "gpu", "max": 4}],
                "priority": 3,
            },
        )
        assert offered["offerPool"]["pool"]["quotas"] == [{"resource": "gpu", "max": 4, "used": 0}]
        updated = await run(
            pool_mutation("updatePool", "UpdatePoolInput"),
            input={"tenantId": "acme", "poolId": pool["id"], "policy": {"singleTenant": True}},
        )
        assert updated["updatePool"]["pool"]["version"] == 3  # the offer made it 2

    async with client(app, guest) as tenant:
        dashboard = await tenant.execute(
            GraphQLRequest(DASHBOARD, variable_values={"tenantId": "beta", "first": 10})
        )
        (seen,) = dashboard["pools"]["nodes"]
        assert seen["quotas"] == [{"resource": "gpu", "max": 4, "used": 0}]
        assert seen["capacity"] == [{"resource": "gpu", "available": 8}]
        assert dashboard["pools"]["pageInfo"]["hasNextPage"] is False

        booked = await tenant.execute(
            GraphQLRequest(
                "mutation($input: CreateReservationInput!) { createReservation(input: $input) "
                "{ reservation { id state resources { resource amount } } } }",
                variable_values={
                    "input": {
                        "tenantId": "beta",
                        "poolId": pool["id"],
                        "resources": [{"resource": "gpu", "amount": 3}],
                    }
                },
            )
        )
        reservation = booked["createReservation"]["reservation"]
        assert reservation["state"] == "ACTIVE"
        try:
            await tenant.execute(
                GraphQLRequest(
                    "mutation($input: CreateReservationInput!) { createReservation(input: "
                    "$input) { reservation { id } } }",
                    variable_values={
                        "input": {
                            "tenantId": "beta",
                            "poolId": pool["id"],
                            "resources": [{"resource": "gpu", "amount": 2}],
                        }
                    },
                )
            )
            raise AssertionError("booking past the quota must fail")
        except TransportQueryError as exc:
            assert exc.errors is not None
            assert exc.errors[0]["extensions"]["code"] == "RESOURCE_EXHAUSTED"
        released = await tenant.execute(
            GraphQLRequest(
                "mutation($input: ReleaseReservationInput!) { releaseReservation(input: "
                "$input) { reservation { state } } }",
                variable_values={"input": {"tenantId": "beta", "reservationId": reservation["id"]}},
            )
        )
        assert released["releaseReservation"]["reservation"]["state"] == "ENDED"

    async with client(app, admin) as owner:
        unoffered = await owner.execute(
            GraphQLRequest(
                "mutation($input: UnofferPoolInput!) { unofferPool(input: $input) { removed } }",
                variable_values={
                    "input": {"tenantId": "acme", "poolId": pool["id"], "toTenantId": "beta"}
                },
            )
        )
        assert unoffered["unofferPool"]["removed"] is True
        archived = await owner.execute(
            GraphQLRequest(
                pool_mutation("archivePool", "ArchivePoolInput"),
                variable_values={"input": {"tenantId": "acme", "poolId": pool["id"]}},
            )
        )
        assert archived["archivePool"]["pool"]["archived"] is True
