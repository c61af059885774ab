"""Logging for `serve`: one JSON object per line when stderr is not a terminal (or
BETTERCOMPUTE_LOG_FORMAT=json), plain text on a terminal. Every record made while a
request is handled carries its `request_id` (app/observe.py)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from app.config import Settings


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
            "()": "pythonjsonlogger.orjson.OrjsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {
                "asctime": "time",
                "levelname": "level",
                "name": "logger",
                "process": "pid",
            },
        }
        if json
        else {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
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
