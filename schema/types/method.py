"""Method: one row of the seed's method table (app/catalog.py)."""

from __future__ import annotations

import strawberry
from strawberry.scalars import JSON

from app.catalog import Method as CatalogMethod


@strawberry.type(description="A method of the pools group, as the seed's method table lists it.")
class Method:
    name: str = strawberry.field(description="The method's name, e.g. `list`.")
    kind: str = strawberry.field(description="`read` or `mutation`.")
    authorization: str = strawberry.field(
        description="The permission and resource the method is decided on, as the seed prints "
        "it (e.g. `compute:pools:read @ compute-pool`)."
    )
    module: str = strawberry.field(description="The module that serves it.")
    phase: str = strawberry.field(description="The release phase that brought it, e.g. `v0.1`.")
    status: str = strawberry.field(description="Its registration status.")
    path: str = strawberry.field(description="The REST shim that serves it.")
    summary: str = strawberry.field(description="What it does, in the seed's words.")
    input: JSON = strawberry.field(description="The JSON Schema of its input table.")

    @classmethod
    def from_catalog(cls, method: CatalogMethod) -> Method:
        row = method.describe()
        return cls(
            name=row["name"],
            kind=row["kind"],
            authorization=row["authorization"],
            module=row["module"],
            phase=row["phase"],
            status=row["status"],
            path=row["path"],
            summary=row["summary"],
            input=row["input"],
        )
