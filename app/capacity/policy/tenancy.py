"""Tenancy keys: whether a pool may be offered to more than one tenant.

The offer/update rules that enforce `singleTenant` need the pool's offers, so
they live in the domain; here only the shape is checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .checks import expect_bool
from .registry import PolicyContext, policy_key

MODULE = "tenancy"


@policy_key("singleTenant", module=MODULE)
def validate_single_tenant(value: object, ctx: PolicyContext, field: str) -> bool:
    return expect_bool(value, field)


def single_tenant(policy: Mapping[str, Any] | None) -> bool:
    """True when the (validated) policy restricts the pool to a single tenant."""
    return (policy or {}).get("singleTenant") is True
