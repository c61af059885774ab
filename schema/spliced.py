"""A field's value already rendered as JSON (a compiled statement's answer), which the
fast executor (schema/executor.py) puts in the result as it is, as the HTTP path puts a
compiled read's answer in its response: no completion of its selection, no per-field
work. Only a resolver whose executor splices (`SPLICES` on its class) may return one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class Spliced:
    value: Any  # parsed JSON or an orjson.Fragment, never None: orjson encodes it as is


# The attribute an execution context class sets to say it puts a Spliced value in place.
SPLICES: Final = "splices_json"
