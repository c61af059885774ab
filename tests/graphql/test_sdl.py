"""schema/schema.graphql is what the schema prints: run scripts/export-schema after a change."""

from pathlib import Path

from strawberry.printer import print_schema

from app.compat import graphql_core_schema
from schema.app import schema

SDL = Path(__file__).parents[2] / "schema" / "schema.graphql"


def test_exported_sdl_is_current() -> None:
    assert SDL.read_text().rstrip() == print_schema(schema).rstrip(), (
        "schema/schema.graphql is stale: run scripts/export-schema"
    )


def test_every_type_and_field_has_a_description() -> None:
    missing = []
    for name, graphql_type in graphql_core_schema(schema).type_map.items():
        if name.startswith("__") or name in ("String", "Int", "Boolean", "ID", "Float"):
            continue
        if not graphql_type.description:
            missing.append(name)
        for field_name, field in getattr(graphql_type, "fields", {}).items():
            if not field.description:
                missing.append(f"{name}.{field_name}")
    assert missing == []
