"""The owner's `lending` ranked by the database (read_rules.capacity_lent and
lending_order): the overcommit it ranks by is Python's quotient at any size."""

from __future__ import annotations

import random

from sqlalchemy import BigInteger, literal, select

from app.capacity.inputs import MAX_AMOUNT
from app.capacity.json_sql import ExactQuotient
from app.db.engine import Database


async def test_a_quotient_past_53_bits_is_pythons(db: Database, dialect: str) -> None:
    """json_sql.ExactQuotient, read_rules' overcommit past a double's exact integers, is
    Python's n / d of ints on each dialect: halfway cases to even, quotients of integers
    a double rounds first (the double of 2^53 + 1 is 2^53), past 64 bits, and tiny."""
    rng = random.Random(21)
    big = 3 * MAX_AMOUNT  # three guests' maxima
    cases = [(2**53 + 1, 3), (2 * (2**53 + 1), 2), (2**54 + 6, 4), (1, MAX_AMOUNT), (big, 7)]
    cases += [(2**53 + 2 * k + 1, 1) for k in range(3)]  # odd: between two doubles
    cases += [(rng.randrange(big), rng.randrange(1, MAX_AMOUNT)) for _ in range(150)]
    cases += [(rng.randrange(2**53, 2**64), rng.randrange(1, 2**12)) for _ in range(150)]
    async with db.reader.connect() as conn:
        for n, d in cases:
            halves = (literal(n >> 32, BigInteger), literal(n & (2**32 - 1), BigInteger))
            quotient = select(ExactQuotient(*halves, literal(d, BigInteger)))
            assert (await conn.execute(quotient)).scalar_one() == n / d, (dialect, n, d)
