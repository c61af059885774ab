"""Provision's host units: hugepages, kernel modules, the Kubernetes join set.

These keys become host configuration on every node of the pool, so anything a
node could not apply is refused up front instead of failing at provision time.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from app.errors import InvalidInput

from .checks import (
    child,
    echo,
    expect_bool,
    expect_int,
    expect_list,
    expect_object,
    expect_str,
    expect_unique,
    item,
    reject_unknown_keys,
)
from .registry import PolicyContext, SecretField, policy_key, policy_rule

MODULE = "provision"

# --- hugepages -----------------------------------------------------------------

HUGEPAGE_SIZES = ("2Mi", "1Gi")
HUGEPAGES_MAX = 1_048_576


@policy_key("hugepages", module=MODULE)
def validate_hugepages(value: object, ctx: PolicyContext, field: str) -> dict[str, int]:
    obj = expect_object(value, field)
    reject_unknown_keys(obj, HUGEPAGE_SIZES, field)
    # An empty object is accepted: it reserves no hugepages, same as leaving the key out.
    return {
        size: expect_int(count, child(field, size), minimum=0, maximum=HUGEPAGES_MAX)
        for size, count in obj.items()
    }


# --- kernelModules -------------------------------------------------------------

KERNEL_MODULE = re.compile(r"[a-z0-9_-]{1,64}")
KERNEL_MODULES_MAX = 64


@policy_key("kernelModules", module=MODULE)
def validate_kernel_modules(value: object, ctx: PolicyContext, field: str) -> list[str]:
    items = expect_list(value, field, max_items=KERNEL_MODULES_MAX)
    names: list[str] = []
    for index, raw in enumerate(items):
        name = expect_str(raw, item(field, index))
        # fullmatch, not `$`: `$` would let a trailing newline through.
        if not KERNEL_MODULE.fullmatch(name):
            raise InvalidInput(
                f"{item(field, index)} must be a kernel module name of 1 to 64 characters "
                f"from a-z, 0-9, '_' and '-', got {echo(name)}",
                field=item(field, index),
            )
        names.append(name)
    expect_unique(names, field)
    return names


# --- kubernetes ----------------------------------------------------------------

JOIN_KEYS = ("apiServer", "token", "caCertHash")
# The join token lets a machine into the tenant's cluster: write-only (CONTRACT section 6).
# Kept on update only for the apiServer and CA it was given for.
JOIN_TOKEN = SecretField("token", bound_to=("apiServer", "caCertHash"))
KUBERNETES_KEYS = (*JOIN_KEYS, "labels")
TOKEN_MAX = 4096
API_SERVER_MAX = 2048
CA_CERT_HASH = re.compile(r"sha256:[0-9a-f]{64}")
# RFC 1123 label, as hostnames and Kubernetes label prefixes use.
_DNS_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
# Kubernetes label name / value: alphanumeric at both ends, `-_.` inside.
LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
LABEL_NAME_MAX = 63
LABEL_PREFIX_MAX = 253

# kubelet refuses to start when --node-labels carries a kubernetes.io / k8s.io
# label outside these (k8s.io/kubelet IsKubeletLabel), so such a policy is one
# the nodes can't take.
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
    }
)
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
RESERVED_LABEL_NAMESPACES = ("kubernetes.io", "k8s.io")


def _in_namespace(prefix: str, namespace: str) -> bool:
    return prefix == namespace or prefix.endswith("." + namespace)


def _has_control_or_space(text: str) -> bool:
    return any(ch.isspace() or not ch.isprintable() for ch in text)


def _check_api_server(value: object, field: str) -> str:
    url = expect_str(value, field)
    problem: str | None = None
    parts = None
    if len(url) > API_SERVER_MAX:
        problem = f"is longer than {API_SERVER_MAX} characters"
    elif _has_control_or_space(url):
        problem = "contains whitespace or control characters"
    else:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            problem = "is not a valid URL"
    if problem is None and parts is not None:
        host = parts.hostname or ""
        if parts.scheme != "https":
            # The join token travels to this server; plain http would leak it.
            problem = "must use https"
        elif not host:
            problem = "must name a host"
        elif parts.username is not None or parts.password is not None:
            # Credentials belong in `token`, not in a URL that gets logged.
            problem = "must not carry credentials"
        elif parts.query or parts.fragment:
            problem = "must not carry a query or fragment"
        elif not _valid_host(host):
            problem = "has an invalid host name"
    if problem is not None:
        raise InvalidInput(
            f"{field} {problem}; expected an https URL such as https://k8s.example.com:6443",
            field=field,
        )
    return url


def _valid_host(host: str) -> bool:
    # urlsplit lowercases the host and strips IPv6 brackets.
    try:
        ipaddress.ip_address(host)
    except ValueError:
        name = host.removesuffix(".")  # a fully qualified trailing dot is fine
        return len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name) is not None
    return True


def _check_token(value: object, field: str) -> str:
    token = expect_str(value, field)
    # Messages never echo the token: it is a credential.
    if not token:
        raise InvalidInput(f"{field} must not be empty", field=field)
    if len(token) > TOKEN_MAX:
        raise InvalidInput(f"{field} must be at most {TOKEN_MAX} characters", field=field)
    if _has_control_or_space(token):
        # A bearer token with whitespace can't be sent in a header.
        raise InvalidInput(
            f"{field} must not contain whitespace or control characters", field=field
        )
    return token


def _check_ca_cert_hash(value: object, field: str) -> str:
    digest = expect_str(value, field)
    if not CA_CERT_HASH.fullmatch(digest):
        raise InvalidInput(
            f"{field} must be 'sha256:' followed by 64 lowercase hex digits "
            f"(as printed by kubeadm), got {echo(digest)}",
            field=field,
        )
    return digest


def _check_label_key(key: str, field: str) -> None:
    prefix, slash, name = key.rpartition("/")
    problem: str | None = None
    if not name or len(name) > LABEL_NAME_MAX or not LABEL_NAME.fullmatch(name):
        problem = (
            f"name must be 1 to {LABEL_NAME_MAX} characters, alphanumeric at both ends "
            "with '-', '_' or '.' inside"
        )
    elif slash and (
        not prefix or len(prefix) > LABEL_PREFIX_MAX or not DNS_SUBDOMAIN.fullmatch(prefix)
    ):
        problem = (
            f"prefix must be a lowercase DNS subdomain of at most {LABEL_PREFIX_MAX} characters"
        )
    elif (
        slash
        and any(_in_namespace(prefix, ns) for ns in RESERVED_LABEL_NAMESPACES)
        and key not in KUBELET_LABELS
        and not any(_in_namespace(prefix, ns) for ns in KUBELET_LABEL_NAMESPACES)
    ):
        problem = (
            "is in a reserved kubernetes.io/k8s.io namespace that kubelet will not "
            "self-assign (allowed: kubelet.kubernetes.io/, node.kubernetes.io/ and the "
            "well-known topology, os and arch labels)"
        )
    if problem is not None:
        raise InvalidInput(f"label key {echo(key)} at {field}: {problem}", field=field)


def _check_labels(value: object, field: str) -> dict[str, str]:
    obj = expect_object(value, field)
    labels: dict[str, str] = {}
    for key, raw in obj.items():
        key_field = child(field, key)
        _check_label_key(key, key_field)
        text = expect_str(raw, key_field)
        if text and (len(text) > LABEL_NAME_MAX or not LABEL_NAME.fullmatch(text)):
            raise InvalidInput(
                f"{key_field} must be empty or at most {LABEL_NAME_MAX} characters, "
                f"alphanumeric at both ends with '-', '_' or '.' inside, got {echo(text)}",
                field=key_field,
            )
        labels[key] = text
    return labels


_JOIN_CHECKS = {
    "apiServer": _check_api_server,
    "token": _check_token,
    "caCertHash": _check_ca_cert_hash,
}


@policy_key("kubernetes", module=MODULE, secrets=(JOIN_TOKEN,))
def validate_kubernetes(value: object, ctx: PolicyContext, field: str) -> dict[str, Any]:
    obj = expect_object(value, field)
    reject_unknown_keys(obj, KUBERNETES_KEYS, field)

    # The join set is all-or-nothing: a node given part of it can't join and
    # would sit half-provisioned.
    given = [key for key in JOIN_KEYS if key in obj]
    missing = [key for key in JOIN_KEYS if key not in obj]
    if given and missing:
        raise InvalidInput(
            f"{field} join set is incomplete: missing {', '.join(missing)} "
            f"(apiServer, token and caCertHash are given together or not at all)",
            field=child(field, missing[0]),
        )

    result: dict[str, Any] = {}
    for key, raw in obj.items():
        if key == "labels":
            result[key] = _check_labels(raw, child(field, key))
        else:
            result[key] = _JOIN_CHECKS[key](raw, child(field, key))
    return result


def has_join_set(policy: Mapping[str, Any]) -> bool:
    """True when the (validated) policy carries a Kubernetes join set."""
    kube = policy.get("kubernetes")
    return isinstance(kube, Mapping) and all(key in kube for key in JOIN_KEYS)


# --- platformOperated ------------------------------------------------------------


@policy_key("platformOperated", module=MODULE)
def validate_platform_operated(value: object, ctx: PolicyContext, field: str) -> bool:
    return expect_bool(value, field)


@policy_rule(module=MODULE)
def platform_join_needs_platform_operated(policy: Mapping[str, Any], ctx: PolicyContext) -> None:
    # Joining a platform machine to a tenant's cluster hands that cluster's
    # admins root on it; the owner must say so explicitly.
    if (
        ctx.site_kind == "platform"
        and has_join_set(policy)
        and policy.get("platformOperated") is not True
    ):
        raise InvalidInput(
            "policy.platformOperated must be true when policy.kubernetes carries a join set "
            "on a platform site: the cluster's admins get root on the platform's machines, "
            "which keep their platform trust",
            field="policy.platformOperated",
        )
