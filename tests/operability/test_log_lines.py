"""One request, one log line, whatever it sends (issue 19, item 8): a path with `%0a`,
`%0d` or other control characters decoded into it cannot write a line of its own, in
the text format (escaped) or in JSON (each line stays one valid object)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.events.processes import bettercompute_serve
from tests.events.support import wait_until
from tests.support import Fleet

# Each request's path decodes to control characters: LF, CR, ESC, NUL, DEL, NEL
# (U+0085), LINE SEPARATOR (U+2028), with a marker after each.
FORGED = "%0aFORGED-LF%0dFORGED-CR%1b[31mFORGED-ESC%00%7f%c2%85FORGED-NEL%e2%80%a8FORGED-LS"
PATHS = (
    f"/api/compute/x/a{FORGED}",  # REST, no token: 404
    f"/nothing{FORGED}",  # no route at all: 404
    f"/api/compute/pools/list{FORGED}",
)
DECODED = "\nFORGED-LF\rFORGED-CR\x1b[31mFORGED-ESC\x00\x7f\x85FORGED-NEL\u2028FORGED-LS"
ESCAPED = "\\nFORGED-LF\\rFORGED-CR\\x1b[31mFORGED-ESC\\x00\\x7f\\x85FORGED-NEL\\u2028FORGED-LS"
LONG_PATH = 32 * 1024
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO app\.access ")
# Any control character but the newline that ends each line, as bytes in the log.
RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]")


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_control_characters_stay_on_one_line(
    database_url: str, fleet: Fleet, log_format: str
) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    async with bettercompute_serve(
        BETTERCOMPUTE_DATABASE_URL=database_url, BETTERCOMPUTE_LOG_FORMAT=log_format
    ) as served:
        async with httpx.AsyncClient(base_url=f"http://{served.address}", timeout=60) as client:
            for path in PATHS:
                answer = await client.post(path, json={})
                assert answer.status_code in (404, 405), answer.text
            # A long path is logged cut (each request's line has a bounded size).
            long = await client.post("/api/compute/x/" + "y" * LONG_PATH, json={})
            assert long.status_code == 404
            # An operation name and a request id with control characters, with a token:
            # neither is logged as sent (the name is `other`, the id one of ours).
            answer = await client.post(
                "/graphql",
                json={"query": "query Q { __typename }", "operationName": "Q\nFORGED-OP"},
                headers={"authorization": f"Bearer {token}", "x-request-id": "a\tFORGED-ID"},
            )
            assert answer.json()["errors"], answer.text

        # Each access line is written as its answer goes out: wait for the last one.
        await wait_until(lambda: b"POST /graphql" in served.log.read_bytes())
        log = served.log.read_bytes()

    lines = log.split(b"\n")
    (cut,) = [line for line in lines if b"/api/compute/x/yyy" in line]
    assert len(cut) < 4096 and f"({LONG_PATH + 15 - 2048} more)".encode() in cut
    forged = [line.decode() for line in lines if b"FORGED" in line]
    # Exactly one line per request, each a whole access record (nothing at a line start).
    assert len(forged) == len(PATHS), forged
    if log_format == "text":
        assert all(TEXT_LINE.match(line) for line in forged), forged
        for path in PATHS:
            sent = path.replace(FORGED, ESCAPED)
            assert sum(f" {sent} 40" in line for line in forged) == 1, (sent, forged)
        assert not any("FORGED-OP" in line or "FORGED-ID" in line for line in forged)
    else:
        records = [json.loads(line) for line in lines if line.strip()]  # every line is JSON
        access = [r for r in records if r["logger"] == "app.access"]
        for path in PATHS:
            sent = path.replace(FORGED, DECODED)
            assert sum(r["message"].startswith(f"POST {sent} 40") for r in access) == 1
        (graphql,) = [r for r in access if r["transport"] == "graphql"]
        assert "FORGED" not in graphql["operation"] + graphql["request_id"]
    assert not RAW_CONTROL.search(log), "a raw control character in the log"
