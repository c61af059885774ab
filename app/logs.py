"""Logging for `serve`: one JSON object per line when stderr is not a terminal (or
BETTERCOMPUTE_LOG_FORMAT=json), plain text on a terminal. Every record made while a
request is handled carries its `request_id` (app/observe.py).

A record is one line whatever its values hold: a logged path or header is the sender's
text, and a newline in it would write a line of the sender's choosing. The text format
escapes control characters (`TextFormatter`), and a record's traceback continues on
indented lines, never at the start of one. JSON escapes C0 controls; `JsonFormatter`
escapes the few that JSON lets through raw (DEL, C1, U+2028/9), which some readers take
for line breaks or terminal commands."""

from __future__ import annotations

import logging
import re
import sys
from types import TracebackType
from typing import Any, TypeAlias

from pythonjsonlogger.core import LogData
from pythonjsonlogger.orjson import OrjsonFormatter

from app.config import Settings

_ExcInfo: TypeAlias = tuple[type[BaseException], BaseException, TracebackType | None]
# C0 and C1 controls, DEL, and Unicode's line and paragraph separators (terminals and
# log viewers break lines there, or act on escape sequences).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def escape_controls(text: str) -> str:
    """`text` on one line: control characters as Python escapes (`\\n`, `\\x1b`)."""
    return _CONTROL.sub(_escaped, text)


class TextFormatter(logging.Formatter):
    """logging's formatter with every control character of a record escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: _ExcInfo | tuple[None, None, None]) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


# What JSON strings may hold raw that `_CONTROL` escapes (orjson escapes the rest); never
# found outside a string in orjson's output, so replaced in the whole text.
_JSON_RAW_CONTROL = re.compile("[\x7f-\x9f\u2028\u2029]")


class JsonFormatter(OrjsonFormatter):
    """python-json-logger's orjson formatter, with every control character escaped."""

    def jsonify_log_record(self, log_data: LogData) -> str:
        return _JSON_RAW_CONTROL.sub(
            lambda m: f"\\u{ord(m.group()):04x}", super().jsonify_log_record(log_data)
        )


def _indented(text: str) -> str:
    """A traceback, each line escaped and indented (the record's first line is the only
    one that starts at the margin)."""
    return "\n".join("    " + escape_controls(line) for line in text.splitlines())


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Not imported here: the serve supervisor logs too, and importing app.observe
        # there would register it as a metrics process (app/metrics.py). Until the app
        # has imported it, no request is being served.
        observe = sys.modules.get("app.observe")
        info = observe.request_info() if observe is not None else None
        if info is not None and not hasattr(record, "request_id"):
            record.request_id = info.request_id
        return True


def logging_config(settings: Settings) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the service and uvicorn (its `log_config`)."""
    json = settings.log_format == "json" or (
        settings.log_format == "auto" and not sys.stderr.isatty()
    )
    formatter: dict[str, Any] = (
        {
            "()": JsonFormatter,
            "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {
                "asctime": "time",
                "levelname": "level",
                "name": "logger",
                "process": "pid",
            },
        }
        if json
        else {
            "()": TextFormatter,
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        }
    )
    level = settings.log_level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "default",
                "filters": ["request_id"],
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            # uvicorn's own handlers would print its lines a second time, unformatted.
            "uvicorn": {"handlers": [], "propagate": True, "level": level},
            "uvicorn.error": {"handlers": [], "propagate": True, "level": level},
            # app/observe.py writes one line per request, with more than uvicorn's.
            "uvicorn.access": {"handlers": [], "propagate": False, "level": "WARNING"},
            # SQLAlchemy keeps its statements at WARNING whatever the root says; at DEBUG
            # they are logged (bound values never are: app/db/engine.py hide_parameters).
            "sqlalchemy.engine": {"level": "INFO" if level == "DEBUG" else "WARNING"},
        },
    }
