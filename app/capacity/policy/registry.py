"""The pool-policy validator registry (CONTRACT section 6).

Each module registers a validator for the policy keys it owns with
`@policy_key(...)`, and cross-key rules with `@policy_rule(...)`. Keeping the
registrations next to the code that consumes each key means a new key cannot
ship without its validator, and the capacity service never has to know every
module's policy shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from app.capacity.errors import InvalidInput

from .checks import child, json_type

POOL_CLASSES = frozenset({"metal-host", "metal-dedicated", "vps-host", "provider"})
SHARING_MODES = frozenset({"exclusive", "mig", "timeslice", "mps"})
SITE_KINDS = frozenset({"platform", "custom"})


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What the policy is checked against: the pool as its nodes will run it."""

    pool_class: str  # metal-host | metal-dedicated | vps-host | provider
    sharing: str  # exclusive | mig | timeslice | mps
    site_kind: str  # platform | custom

    def __post_init__(self) -> None:
        # The domain builds the context from validated fields, so a bad value
        # here is a programming error, not user input: fail loudly.
        if self.pool_class not in POOL_CLASSES:
            raise ValueError(f"unknown pool class {self.pool_class!r}")
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"unknown sharing mode {self.sharing!r}")
        if self.site_kind not in SITE_KINDS:
            raise ValueError(f"unknown site kind {self.site_kind!r}")


# (value, context, field path such as "policy.hugepages") -> normalized value
KeyValidator = Callable[[object, PolicyContext, str], Any]
# (normalized policy, read-only; context) -> None, raising InvalidInput
RuleValidator = Callable[[Mapping[str, Any], PolicyContext], None]

_K = TypeVar("_K", bound=KeyValidator)
_R = TypeVar("_R", bound=RuleValidator)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    key: str
    module: str
    validate: KeyValidator


@dataclass(frozen=True, slots=True)
class RuleEntry:
    name: str
    module: str
    check: RuleValidator


class PolicyRegistry:
    """Validators by policy key, plus whole-policy rules run after every key passed."""

    def __init__(self) -> None:
        self._keys: dict[str, KeyEntry] = {}
        self._rules: list[RuleEntry] = []

    def key(self, key: str, *, module: str) -> Callable[[_K], _K]:
        """Decorator: `fn` validates and normalizes `policy[key]`; `module` owns the key."""

        def register(fn: _K) -> _K:
            existing = self._keys.get(key)
            if existing is not None:
                # Two owners for one key would make the accepted shape depend on import order.
                raise ValueError(
                    f"policy key {key!r} is already registered by module {existing.module!r}"
                )
            self._keys[key] = KeyEntry(key=key, module=module, validate=fn)
            return fn

        return register

    def rule(self, *, module: str) -> Callable[[_R], _R]:
        """Decorator: `fn` checks a cross-key rule on the normalized policy."""

        def register(fn: _R) -> _R:
            self._rules.append(RuleEntry(name=fn.__name__, module=module, check=fn))
            return fn

        return register

    def keys(self) -> Mapping[str, KeyEntry]:
        return MappingProxyType(self._keys)

    def rules(self) -> tuple[RuleEntry, ...]:
        return tuple(self._rules)

    def owner(self, key: str) -> str | None:
        """The module that owns `key`, or None for an unknown key."""
        entry = self._keys.get(key)
        return entry.module if entry is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def validate(self, policy: object, ctx: PolicyContext) -> dict[str, Any]:
        """Check `policy` for a pool in `ctx`; return a fresh normalized dict.

        Raises InvalidInput naming the offending field (`policy.<key>...`).
        The input is never mutated: validators build new values.
        """
        if not isinstance(policy, dict):
            raise InvalidInput(
                f"policy must be a JSON object, got {json_type(policy)}", field="policy"
            )
        for key in policy:
            if not isinstance(key, str):
                raise InvalidInput("policy must be a JSON object with string keys", field="policy")

        # Unknown keys first, all named at once, so a typo is reported before
        # some unrelated key's error sends the caller off in the wrong direction.
        unknown = [key for key in policy if key not in self._keys]
        if unknown:
            names = ", ".join(child("policy", key) for key in unknown)
            known = ", ".join(sorted(self._keys))
            raise InvalidInput(
                f"unknown policy key(s): {names}; known keys: {known}",
                field=child("policy", unknown[0]),
            )

        normalized: dict[str, Any] = {}
        for key, value in policy.items():
            entry = self._keys[key]
            normalized[key] = entry.validate(value, ctx, child("policy", key))

        view = MappingProxyType(normalized)  # rules read, never write
        for rule in self._rules:
            rule.check(view, ctx)
        return normalized


registry = PolicyRegistry()
policy_key = registry.key
policy_rule = registry.rule


def validate_policy(policy: object, ctx: PolicyContext) -> dict[str, Any]:
    """Validate and normalize a pool policy with every registered module's validators."""
    return registry.validate(policy, ctx)
