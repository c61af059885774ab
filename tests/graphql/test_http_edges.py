"""`/graphql` over HTTP: the token is checked before the body is read, the body limit,
and malformed requests that are INVALID_INPUT, never INTERNAL."""

from __future__ import annotations

import pytest

from tests.body_stream import CHUNK, ChunkedBody
from tests.support import Api, Fleet

LIMIT = 1_048_576  # the default BETTERCOMPUTE_MAX_BODY_BYTES


@pytest.fixture
async def token(fleet: Fleet) -> str:
    await fleet.tenant("acme")
    return await fleet.caller("acme", "admin")


def headers_for(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "content-type": "application/json"}


async def test_without_a_token_nothing_is_read_and_the_answer_keeps_its_shape(
    api: Api,
) -> None:
    """UNAUTHENTICATED as a resolver answered it (200, data null, the code in errors),
    now before a byte of the body is read: 50 MB without a token were read and parsed."""
    body = ChunkedBody(50 << 20, prefix=b'{"query": "{ catalog { name } }", "x": "')
    response = await api.client.post(
        "/graphql", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert response.json() == {
        "data": None,
        "errors": [{"message": "missing bearer token", "extensions": {"code": "UNAUTHENTICATED"}}],
    }
    assert body.pulled == 0
    # Introspection and GET queries too; GraphiQL's page needs no token.
    refused = await api.client.get("/graphql", params={"query": "{ __typename }"})
    assert refused.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    page = await api.client.get("/graphql", headers={"accept": "text/html"})
    assert page.status_code == 200


async def test_a_body_over_the_limit_is_413_in_graphqls_error_shape(api: Api, token: str) -> None:
    body = ChunkedBody(50 << 20, prefix=b'{"query": "{ catalog { name } }", "x": "')
    response = await api.client.post("/graphql", content=body, headers=headers_for(token))
    assert response.status_code == 413
    assert response.json() == {
        "data": None,
        "errors": [
            {
                "message": f"the request body is over the limit of {LIMIT} bytes",
                "extensions": {"code": "RESOURCE_EXHAUSTED", "limit": "body", "maxBytes": LIMIT},
            }
        ],
    }
    assert body.pulled <= LIMIT + CHUNK
    declared = ChunkedBody(LIMIT + 1)
    headers = {**headers_for(token), "content-length": str(LIMIT + 1)}
    response = await api.client.post("/graphql", content=declared, headers=headers)
    assert response.status_code == 413
    assert declared.pulled == 0


@pytest.mark.parametrize("body", [b"null", b'"x"', b"1", b"true"])
async def test_a_json_body_that_is_not_an_object_is_invalid_input(
    api: Api, token: str, body: bytes
) -> None:
    """These answered 500 (strawberry read fields of whatever the JSON held)."""
    response = await api.client.post("/graphql", content=body, headers=headers_for(token))
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["extensions"] == {"code": "INVALID_INPUT"}
    assert error["message"] == "the request body must be a JSON object"


async def test_a_subscription_over_http_is_invalid_input(api: Api, token: str) -> None:
    """It ran its resolver as a plain field and answered INTERNAL."""
    answer = await api.graphql(token, 'subscription { poolEvents(tenantId: "acme") { type } }')
    assert answer["data"] is None
    error = answer["errors"][0]
    assert error["extensions"] == {"code": "INVALID_INPUT"}
    assert "websockets" in error["message"]


async def test_several_operations_need_an_operation_name(api: Api, token: str) -> None:
    """GraphQL spec, GetOperation: without operationName the first one ran."""
    document = "query A { catalog { name } } query B { __typename }"
    answer = await api.graphql(token, document)
    assert answer == {
        "data": None,
        "errors": [
            {
                "message": "Must provide operation name if query contains multiple operations.",
                "extensions": {"code": "INVALID_INPUT"},
            }
        ],
    }
    named = await api.client.post(
        "/graphql",
        json={"query": document, "operationName": "B"},
        headers=headers_for(token),
    )
    assert named.json()["data"] == {"__typename": "Query"} and "errors" not in named.json()
    # One operation needs no name; a name that matches none is INVALID_INPUT.
    assert "errors" not in await api.graphql(token, "query A { __typename }")
    unknown = await api.client.post(
        "/graphql",
        json={"query": document, "operationName": "C"},
        headers=headers_for(token),
    )
    assert unknown.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
