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

from app.errors import InvalidInput

from .checks import child, expect_bool, json_type

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
class SecretField:
    """A write-only field of a key's object value (CONTRACT section 6): stored for the
    nodes, never read back. Reads show `<name>Set: true` in its place; a policy sent back
    with that marker and no new value keeps the stored one (see `PolicyRegistry.validate`).
    """

    name: str
    # A stored secret is kept only while these fields keep their stored values: kept for a
    # new apiServer, a join token would be sent to a server its writer never chose.
    bound_to: tuple[str, ...] = ()

    @property
    def marker(self) -> str:
        return f"{self.name}Set"


@dataclass(frozen=True, slots=True)
class KeyEntry:
    key: str
    module: str
    validate: KeyValidator
    secrets: tuple[SecretField, ...] = ()


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

    def key(
        self, key: str, *, module: str, secrets: tuple[SecretField, ...] = ()
    ) -> Callable[[_K], _K]:
        """Decorator: `fn` validates and normalizes `policy[key]`; `module` owns the key and
        declares which fields of its object value are `secrets`."""

        def register(fn: _K) -> _K:
            existing = self._keys.get(key)
            if existing is not None:
                # Two owners for one key would make the accepted shape depend on import order.
                raise ValueError(
                    f"policy key {key!r} is already registered by module {existing.module!r}"
                )
            self._keys[key] = KeyEntry(key=key, module=module, validate=fn, secrets=secrets)
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

    def validate(
        self, policy: object, ctx: PolicyContext, stored: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Check `policy` for a pool in `ctx`; return a fresh normalized dict.

        `stored` is the policy it replaces (on update): a secret sent back as
        `<name>Set: true` without a new value keeps the stored one.
        Raises InvalidInput naming the offending field (`policy.<key>...`); a message never
        echoes a secret. The input is never mutated: validators build new values.
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
            field = child("policy", key)
            kept = _keep_secrets(entry, value, (stored or {}).get(key), field)
            normalized[key] = entry.validate(kept, ctx, field)

        view = MappingProxyType(normalized)  # rules read, never write
        for rule in self._rules:
            rule.check(view, ctx)
        return normalized

    def secret_names(self) -> frozenset[str]:
        """The names of every key's secret fields (`token`): what any surface that shows
        input as sent (traces, error messages) must leave out, wherever it appears."""
        return frozenset(s.name for entry in self._keys.values() for s in entry.secrets)

    def readable(self, policy: Mapping[str, Any]) -> dict[str, Any]:
        """The policy as anyone may read it: each stored secret replaced by
        `<name>Set: true`, in its place. The one function every surface reads it through."""
        shown = dict(policy)
        for key, value in policy.items():
            entry = self._keys.get(key)
            if entry is None or not entry.secrets or not isinstance(value, Mapping):
                continue
            markers = {s.name: s.marker for s in entry.secrets}
            shown[key] = {
                markers.get(name, name): True if name in markers else item
                for name, item in value.items()
            }
        return shown


def _keep_secrets(entry: KeyEntry, value: object, stored: object, field: str) -> object:
    """`value` with each `<secret>Set` marker taken out: `true` without a new secret puts
    the stored one back (refused when none is stored, or when a field it is bound to
    changed); `false`, or a new secret given beside it, keeps nothing of the old one."""
    if not entry.secrets or not isinstance(value, dict):
        return value  # the key's validator reports a wrong type
    value = dict(value)
    old = stored if isinstance(stored, Mapping) else {}
    for secret in entry.secrets:
        if secret.marker not in value:
            continue
        marker_field = child(field, secret.marker)
        keep = expect_bool(value.pop(secret.marker), marker_field)
        if not keep or secret.name in value:
            continue
        secret_field = child(field, secret.name)
        if secret.name not in old:
            raise InvalidInput(
                f"{marker_field} is true but no {secret.name} is stored to keep; "
                f"give {secret_field}",
                field=marker_field,
            )
        moved = [name for name in secret.bound_to if value.get(name) != old.get(name)]
        if moved:
            raise InvalidInput(
                f"{child(field, moved[0])} differs from the stored one, so the stored "
                f"{secret.name} is not kept: give {secret_field} again (a stored "
                f"{secret.name} is kept only with the {', '.join(secret.bound_to)} it was "
                "given with)",
                field=secret_field,
            )
        value[secret.name] = old[secret.name]
    return value


registry = PolicyRegistry()
policy_key = registry.key
policy_rule = registry.rule


def validate_policy(
    policy: object, ctx: PolicyContext, stored: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validate and normalize a pool policy with every registered module's validators;
    `stored` is the policy it replaces, whose secrets `<name>Set: true` keeps."""
    return registry.validate(policy, ctx, stored)


def readable_policy(policy: Mapping[str, Any]) -> dict[str, Any]:
    """A stored policy as every surface shows it: no secret, `<name>Set: true` instead."""
    return registry.readable(policy)


def secret_field_names() -> frozenset[str]:
    """Every policy key's secret field names (`token`), for surfaces that echo input."""
    return registry.secret_names()
