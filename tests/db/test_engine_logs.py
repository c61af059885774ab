"""Bound values never reach a log line or an error message (CONTRACT section 6: a pool
policy's join token is shown nowhere): not with SQL logging on, not from the driver,
not when a statement fails and the failure is logged as INTERNAL."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from app.db.engine import Database
from app.db.errors import to_domain_error
from app.db.models import Pool
from tests.support import Fleet

TOKEN = "s3cr3t.l0gt0k3nv4lue"


async def test_a_failed_insert_of_a_policy_logs_no_secret(
    db: Database, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything: drivers, errors...
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")  # ...and SQL statements
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    row = {
        "id": "pool_" + "1" * 26,
        "tenant_id": "acme",
        "site_id": site,
        "pool_class": "metal-host",
        "sharing": "exclusive",
        "agent": "bcd",
        "policy": {"kubernetes": {"token": TOKEN}},
        "region": "eu-west",
    }
    async with db.writer.begin() as conn:
        await conn.execute(insert(Pool), row)
    with pytest.raises(IntegrityError) as failed:
        async with db.writer.begin() as conn:
            await conn.execute(insert(Pool), row)  # the same id again
    assert to_domain_error(failed.value).code == "INTERNAL"  # logged with its traceback
    assert "unhandled error" in caplog.text
    statements = [r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy")]
    assert any("INSERT INTO pools" in m for m in statements)  # logged, without their values
    assert TOKEN not in str(failed.value)
    assert TOKEN not in caplog.text
