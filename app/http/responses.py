"""A JSON response rendered by orjson, for REST, GraphQL and the health routes."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse as _StarletteJSON


class JSONResponse(_StarletteJSON):
    """orjson: several times faster than the stdlib on large pool lists."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
