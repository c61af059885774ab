"""Pool-policy validation (CONTRACT section 6).

Importing this package imports every validator module, so the registry is
complete before anyone calls `validate_policy`.
"""

from __future__ import annotations

# Imported for their registrations; order is irrelevant (keys are disjoint).
from . import images, provision, sharing, tenancy
from .images import prewarm_images
from .provision import has_join_set
from .registry import (
    KeyEntry,
    KeyValidator,
    PolicyContext,
    PolicyRegistry,
    RuleEntry,
    RuleValidator,
    SecretField,
    policy_key,
    policy_rule,
    readable_policy,
    registry,
    secret_field_names,
    validate_policy,
)
from .sharing import mig_instances_per_gpu, replicas
from .tenancy import single_tenant

__all__ = [
    "KeyEntry",
    "KeyValidator",
    "PolicyContext",
    "PolicyRegistry",
    "RuleEntry",
    "RuleValidator",
    "SecretField",
    "has_join_set",
    "images",
    "mig_instances_per_gpu",
    "policy_key",
    "policy_rule",
    "prewarm_images",
    "provision",
    "readable_policy",
    "registry",
    "replicas",
    "secret_field_names",
    "sharing",
    "single_tenant",
    "tenancy",
    "validate_policy",
]
