"""The GraphQL the docs show is GraphQL this service serves: every `graphql` code block
of README.md and docs/ holds exactly one operation, valid against schema/schema.graphql;
and the SDL describes what a client must know (each mutation's `input`, the custom
scalars with `@specifiedBy`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from graphql import (
    GraphQLScalarType,
    OperationDefinitionNode,
    build_schema,
    parse,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = build_schema((ROOT / "schema" / "schema.graphql").read_text())
BLOCK = re.compile(r"```graphql\n(.*?)```", re.DOTALL)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [
    pytest.param(block, id=f"{doc.relative_to(ROOT)}#{n}")
    for doc in DOCS
    for n, block in enumerate(BLOCK.findall(doc.read_text()), start=1)
]


def test_the_docs_show_graphql() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("block", BLOCKS)
def test_each_block_is_one_valid_operation(block: str) -> None:
    document = parse(block)
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    assert len(operations) == 1, "one operation per code block"
    assert validate(SCHEMA, document) == []


def test_mutation_inputs_and_scalars_are_described() -> None:
    mutation = SCHEMA.mutation_type
    assert mutation is not None
    for name, field in mutation.fields.items():
        assert field.args["input"].description, name
    for name in ("DateTime", "Long", "JSON"):
        scalar = SCHEMA.type_map[name]
        assert isinstance(scalar, GraphQLScalarType)
        assert scalar.description and scalar.specified_by_url, name
