"""PageInfo: where a keyset page sits in its list."""

from __future__ import annotations

import strawberry


@strawberry.type(description="Relay page information for a keyset-paged connection.")
class PageInfo:
    has_next_page: bool = strawberry.field(description="Whether items follow this page.")
    has_previous_page: bool = strawberry.field(
        description="Whether this page was asked for `after` a cursor."
    )
    start_cursor: str | None = strawberry.field(
        description="The cursor of the page's first item; null for an empty page."
    )
    end_cursor: str | None = strawberry.field(
        description="The cursor to pass as `after` for the next page; null for an empty page."
    )
