"""Images module: container images the site's agents pull ahead of time.

A change to `prewarmImages` bumps the desired-state revision of the site's
agents (done by the domain on update); here only the references are checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.errors import InvalidInput

from .checks import echo, expect_list, expect_str, expect_unique, item
from .registry import PolicyContext, policy_key

MODULE = "images"

PREWARM_IMAGES_MAX = 32
NAME_MAX = 255  # distribution's NameTotalLengthMax (registry host + repository path)

# Modelled on github.com/distribution/reference (regexp.go), written out in
# ASCII so Python's Unicode `\w` can't widen it.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[[a-fA-F0-9:]+\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
# The digest algorithms the OCI image spec registers, with their fixed lengths.
_DIGEST = r"sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}"

IMAGE_REFERENCE = re.compile(
    rf"(?P<domain>{_DOMAIN})/(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?"
    rf"(?:@(?P<digest>{_DIGEST}))?"
)


def _is_registry_host(domain: str) -> bool:
    # distribution's rule for telling a registry from a first path component.
    # We require one: an unqualified name resolves differently per runtime
    # (docker.io default, podman search lists), which invites spoofing.
    return "." in domain or ":" in domain or domain == "localhost" or domain != domain.lower()


def _check_reference(ref: str, field: str) -> None:
    match = IMAGE_REFERENCE.fullmatch(ref)
    problem: str | None = None
    if match is None:
        problem = (
            "must be an image reference: registry/repository[:tag][@sha256:<64 hex>], "
            "repository lowercase"
        )
    elif not _is_registry_host(match["domain"]):
        problem = (
            "must name its registry host (e.g. docker.io/library/ubuntu:24.04), "
            "since unqualified names resolve differently per runtime"
        )
    elif len(match["domain"]) + 1 + len(match["path"]) > NAME_MAX:
        problem = f"name (registry and repository) must be at most {NAME_MAX} characters"
    if problem is not None:
        raise InvalidInput(f"{field} {problem}, got {echo(ref)}", field=field)


@policy_key("prewarmImages", module=MODULE)
def validate_prewarm_images(value: object, ctx: PolicyContext, field: str) -> list[str]:
    items = expect_list(value, field, max_items=PREWARM_IMAGES_MAX)
    refs: list[str] = []
    for index, raw in enumerate(items):
        ref = expect_str(raw, item(field, index))
        _check_reference(ref, item(field, index))
        refs.append(ref)
    expect_unique(refs, field)
    return refs


def prewarm_images(policy: Mapping[str, Any] | None) -> list[str]:
    """The (validated) policy's prewarm list, empty by default; compare to detect a change."""
    images = (policy or {}).get("prewarmImages")
    return [str(ref) for ref in images] if isinstance(images, list | tuple) else []
