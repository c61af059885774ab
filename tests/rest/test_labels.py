"""Names and labels on pools (CONTRACT section 10, issue 23 item 3): displayName and labels
given on create, the `label` method (REST and GraphQL), its event, and the labelSelector
of list / pools, through the real HTTP app on both dialects."""

from __future__ import annotations

from typing import Any

import pytest

from app.capacity.labels import Requirement, parse_selector
from app.db.engine import Database
from app.errors import InvalidInput
from tests.rest.scene import Scene, events
from tests.support import Api, Fleet

Json = dict[str, Any]

LABEL = """mutation($input: LabelPoolInput!) {
  labelPool(input: $input) { pool { id displayName labels version } } }"""
POOLS = """query($t: String!, $s: String, $first: Int, $after: String) {
  pools(tenantId: $t, labelSelector: $s, first: $first, after: $after) {
    pageInfo { hasNextPage endCursor } nodes { id displayName labels } } }"""


# -- the selector's syntax -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("a=b", [Requirement("a", "=", ("b",))]),
        ("a==b", [Requirement("a", "=", ("b",))]),
        ("a!=b", [Requirement("a", "!=", ("b",))]),
        ("a in (x,y)", [Requirement("a", "in", ("x", "y"))]),
        ("a notin (x)", [Requirement("a", "notin", ("x",))]),
        ("a", [Requirement("a", "exists")]),
        ("!a", [Requirement("a", "!")]),
        ("a=", [Requirement("a", "=", ("",))]),
        ("", []),
        ("   ", []),
        (
            " example.com/tier = gold , team in ( ml , web ),!x,env",
            [
                Requirement("example.com/tier", "=", ("gold",)),
                Requirement("team", "in", ("ml", "web")),
                Requirement("x", "!"),
                Requirement("env", "exists"),
            ],
        ),
        ("in in (in)", [Requirement("in", "in", ("in",))]),  # a key may be called `in`
        ("a notin(x)", [Requirement("a", "notin", ("x",))]),
    ],
)
def test_every_form_of_the_selector_parses(text: str, parsed: list[Requirement]) -> None:
    assert list(parse_selector(text)) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "a=b,",  # a trailing comma
        ",a",
        "a b",
        "a in (x",
        "a in x",
        "a in (x,,y",
        "a in ((x))",
        "a = b = c",
        "a < 3",  # Kubernetes' Gt/Lt are not supported
        "!",
        "!a=b",
        "a=b c",
        "-a=b",  # a key starts with an alphanumeric
        "a=" + "v" * 64,  # a value of 64 characters
        "A.com/x=y",  # a prefix is lowercase
        "a=b/c",
        ",".join(f"k{i}" for i in range(33)),  # 33 requirements
        "a in (" + ",".join(f"v{i}" for i in range(33)) + ")",  # 33 values
        "a" * 4097,
    ],
)
def test_a_malformed_selector_is_invalid_input(text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_selector(text)
    assert caught.value.field == "labelSelector"


def test_the_bounds_themselves_parse() -> None:
    """32 requirements, and a set of 32 values, are within the bounds."""
    assert len(parse_selector(",".join(f"k{i}=v" for i in range(32)))) == 32
    (one,) = parse_selector("a in (" + ",".join(f"v{i}" for i in range(32)) + ")")
    assert len(one.values) == 32


# -- create, read, label ---------------------------------------------------------------------


async def test_create_takes_a_name_and_labels_and_every_read_shows_them(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    labels = {"team": "ml", "example.com/tier": "gold", "empty": ""}
    pool = await s.pool(displayName="Training H100s", labels=labels)
    assert (pool["displayName"], pool["labels"]) == ("Training H100s", labels)
    assert (await s.get(pool["id"]))["labels"] == labels
    listed = (await api.ok(s.token, "pools/list", {"tenantId": "acme"}))["pools"]
    assert [(p["displayName"], p["labels"]) for p in listed] == [("Training H100s", labels)]
    plain = await s.pool()
    assert (plain["displayName"], plain["labels"]) == (None, {})
    (created, *_) = await events(db, pool["id"])
    assert created.type == "pool.created"
    assert (created.data["displayName"], created.data["labels"]) == ("Training H100s", labels)
    answer = await api.graphql(
        s.token,
        "query($t: String!, $p: ID!) { pool(tenantId: $t, poolId: $p) { displayName labels } }",
        {"t": "acme", "p": pool["id"]},
    )
    assert answer["data"] == {"pool": {"displayName": "Training H100s", "labels": labels}}


async def test_update_keeps_the_seed_fields_exactly(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    for field, value in (("displayName", "x"), ("labels", {"a": "b"})):
        status, error = await api.fails(
            s.token, "pools/update", s.body(pool["id"], gpuModel="A100", **{field: value})
        )
        assert (status, error["code"], error["details"]["field"]) == (400, "INVALID_INPUT", field)


async def test_label_replaces_the_map_moves_the_version_and_emits_the_changes(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool(labels={"team": "ml", "a.io/x": "1"})
    await s.offer(pool["id"], "beta", {"gpu": 1})  # version 2
    body = s.body(pool["id"], displayName="Night batch", labels={"team": "web", "env": "prod"})
    labelled = (await api.ok(s.token, "pools/label", body))["pool"]
    assert labelled["version"] == 3
    assert (labelled["displayName"], labelled["labels"]) == (
        "Night batch",
        {"team": "web", "env": "prod"},
    )
    event = (await events(db, pool["id"]))[-1]
    assert event.type == "pool.updated"
    assert event.audience == {"acme", "beta"}
    assert event.data == {
        "version": 3,
        "changed": ["displayName", "labels"],
        "changes": [
            {"path": "/displayName", "before": None, "after": "Night batch"},
            {"path": "/labels/a.io~1x", "before": "1", "after": None},
            {"path": "/labels/env", "before": None, "after": "prod"},
            {"path": "/labels/team", "before": "ml", "after": "web"},
        ],
    }
    # The same again changes nothing: no version, no event.
    count = len(await events(db))
    again = (await api.ok(s.token, "pools/label", body))["pool"]
    assert again["version"] == 3 and len(await events(db)) == count
    # displayName alone; "" removes the name; labels {} removes every label.
    only = (await api.ok(s.token, "pools/label", s.body(pool["id"], displayName="")))["pool"]
    assert (only["displayName"], only["labels"], only["version"]) == (
        None,
        {"team": "web", "env": "prod"},
        4,
    )
    cleared = (await api.ok(s.token, "pools/label", s.body(pool["id"], labels={})))["pool"]
    assert (cleared["labels"], cleared["version"]) == ({}, 5)


async def test_label_takes_a_version(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    stale = s.body(pool["id"], labels={"a": "b"}, version=2)
    status, error = await api.fails(s.token, "pools/label", stale)
    assert (status, error["code"], error["details"]["currentVersion"]) == (409, "CONFLICT", 1)
    assert (await s.get(pool["id"]))["labels"] == {}
    current = s.body(pool["id"], labels={"a": "b"}, version=1)
    assert (await api.ok(s.token, "pools/label", current))["pool"]["version"] == 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "displayName"),  # at least one of the two
        ({"displayName": "x" * 129}, "displayName"),
        ({"displayName": 5}, "displayName"),
        ({"labels": {"-bad": "v"}}, "labels.-bad"),
        ({"labels": {"Upper.com/x": "v"}}, "labels.Upper.com/x"),
        ({"labels": {"a" * 64: "v"}}, "labels." + "a" * 64),
        ({"labels": {("p" * 63 + ".") * 4 + "q/x": "v"}}, "labels." + ("p" * 63 + ".") * 4 + "q/x"),
        ({"labels": {"k": "v" * 64}}, "labels.k"),
        ({"labels": {"k": "a b"}}, "labels.k"),
        ({"labels": {"k": 1}}, "labels.k"),
        ({"labels": {f"k{i}": "v" for i in range(33)}}, "labels"),
        ({"labels": ["a"]}, "labels"),
    ],
)
async def test_a_bad_name_or_label_is_invalid_input_naming_the_field(
    api: Api, fleet: Fleet, fields: Json, field: str
) -> None:
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    status, error = await api.fails(s.token, "pools/label", s.body(pool["id"], **fields))
    assert (status, error["code"], error["details"]["field"]) == (400, "INVALID_INPUT", field)
    if fields:  # create validates them alike
        body = {"tenantId": "acme", "siteId": s.site, "class": "metal-host", **fields}
        status, error = await api.fails(s.token, "pools/create", body)
        assert (status, error["code"], error["details"]["field"]) == (400, "INVALID_INPUT", field)


async def test_a_tenant_that_cannot_see_the_pool_gets_not_found_and_a_viewer_is_denied(
    api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    viewer = await fleet.caller("acme", "viewer")
    pool = await s.pool()
    hidden = {"tenantId": "beta", "poolId": pool["id"], "labels": {"a": "b"}}
    missing = {**hidden, "poolId": "pool_01j00000000000000000000000"}
    seen, unseen = (
        await api.fails(beta, "pools/label", hidden),
        await api.fails(beta, "pools/label", missing),
    )
    # The same answer as for a pool that does not exist, but for the id it names.
    assert seen[0] == unseen[0] == 404
    assert seen[1]["details"] == unseen[1]["details"] == {"field": "poolId"}
    assert seen[1]["message"].replace(pool["id"], "ID") == unseen[1]["message"].replace(
        missing["poolId"], "ID"
    )
    assert (await api.fails(beta, "pools/label", hidden))[1]["code"] == "NOT_FOUND"
    await s.offer(pool["id"], "beta", {"gpu": 1})  # offered is not owned: still NOT_FOUND
    assert (await api.fails(beta, "pools/label", hidden))[1]["code"] == "NOT_FOUND"
    status, error = await api.fails(viewer, "pools/label", s.body(pool["id"], labels={"a": "b"}))
    assert (status, error["code"]) == (403, "PERMISSION_DENIED")
    assert (await s.get(pool["id"]))["labels"] == {}


async def test_label_pool_over_graphql(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    viewer = await fleet.caller("acme", "viewer")
    pool = await s.pool()
    given = {"tenantId": "acme", "poolId": pool["id"], "displayName": "GQL", "labels": {"a": "b"}}
    answer = await api.graphql(s.token, LABEL, {"input": given})
    assert answer.get("errors") is None, answer
    assert {"data": answer["data"]} == {
        "data": {
            "labelPool": {
                "pool": {"id": pool["id"], "displayName": "GQL", "labels": {"a": "b"}, "version": 2}
            }
        }
    }
    for bad, field in (
        ({"labels": {"a": "b c"}}, "labels.a"),
        ({}, "displayName"),
        ({"labels": {"a": "b"}, "version": 1}, "version"),
    ):
        answer = await api.graphql(
            s.token, LABEL, {"input": {"tenantId": "acme", "poolId": pool["id"], **bad}}
        )
        (error,) = answer["errors"]
        code = "CONFLICT" if field == "version" else "INVALID_INPUT"
        assert error["extensions"]["code"] == code, answer
        assert error["extensions"]["field"] == field, answer
    denied = await api.graphql(viewer, LABEL, {"input": given})
    assert denied["errors"][0]["extensions"]["code"] == "PERMISSION_DENIED"


# -- selecting -------------------------------------------------------------------------------


async def _labelled(s: Scene) -> dict[str, str]:
    specs = {
        "ml-gold": {"team": "ml", "example.com/tier": "gold"},
        "ml": {"team": "ml"},
        "web-empty": {"team": "web", "env": ""},
        "none": {},
    }
    return {name: (await s.pool(labels=labels))["id"] for name, labels in specs.items()}


SELECTIONS = [
    ("team=ml", {"ml-gold", "ml"}),
    ("team==ml", {"ml-gold", "ml"}),
    ("team!=ml", {"web-empty", "none"}),  # a pool without the label too
    ("team in (ml, web)", {"ml-gold", "ml", "web-empty"}),
    ("team notin (ml)", {"web-empty", "none"}),
    ("example.com/tier", {"ml-gold"}),
    ("!example.com/tier", {"ml", "web-empty", "none"}),
    ("team=ml,example.com/tier=gold", {"ml-gold"}),
    ("team=ml,!example.com/tier", {"ml"}),
    ("env=", {"web-empty"}),
    ("env", {"web-empty"}),
    ("nope=x", set()),
    ("", {"ml-gold", "ml", "web-empty", "none"}),
]


@pytest.mark.parametrize(("selector", "names"), SELECTIONS)
async def test_list_selects_by_labels(
    api: Api, fleet: Fleet, selector: str, names: set[str]
) -> None:
    s = await Scene.start(api, fleet)
    ids = await _labelled(s)
    body = {"tenantId": "acme", "labelSelector": selector}
    listed = (await api.ok(s.token, "pools/list", body))["pools"]
    assert {p["id"] for p in listed} == {ids[n] for n in names}
    answer = await api.graphql(s.token, POOLS, {"t": "acme", "s": selector})
    assert {p["id"] for p in answer["data"]["pools"]["nodes"]} == {ids[n] for n in names}


async def test_a_selected_page_pages_through_the_selection(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    ids = await _labelled(s)
    seen: list[str] = []
    after = None
    while True:
        answer = await api.graphql(
            s.token, POOLS, {"t": "acme", "s": "team", "first": 1, "after": after}
        )
        page = answer["data"]["pools"]
        seen += [p["id"] for p in page["nodes"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == sorted(ids[n] for n in ("ml-gold", "ml", "web-empty"))


async def test_a_malformed_selector_is_invalid_input_on_both_surfaces(
    api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    status, error = await api.fails(
        s.token, "pools/list", {"tenantId": "acme", "labelSelector": "team in (ml"}
    )
    assert (status, error["code"], error["details"]["field"]) == (
        400,
        "INVALID_INPUT",
        "labelSelector",
    )
    answer = await api.graphql(s.token, POOLS, {"t": "acme", "s": "a b"})
    (gql_error,) = answer["errors"]
    assert gql_error["extensions"]["code"] == "INVALID_INPUT"
    assert gql_error["extensions"]["field"] == "labelSelector"


async def test_a_guest_selects_among_the_pools_it_sees(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    ids = await _labelled(s)
    await s.offer(ids["ml"], "beta", {"gpu": 1})
    listed = await api.ok(beta, "pools/list", {"tenantId": "beta", "labelSelector": "team=ml"})
    assert [p["id"] for p in listed["pools"]] == [ids["ml"]]
    assert listed["pools"][0]["labels"] == {"team": "ml"}
