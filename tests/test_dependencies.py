"""The dependency tree is pinned (requirements/lock.txt, written by scripts/lock) and what
the service imports is declared (pyproject.toml).

- every package the service and its schema import comes from a declared dependency;
- every declared dependency is pinned (==), and the lock pins it to the same version;
- every package of the lock is pinned with hashes (pip --require-hashes installs it);
- `.venv` holds what the lock pins (scripts/bootstrap installed it).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import distributions, version
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = (ROOT / "requirements" / "lock.txt").read_text()


def declared(*extras: str) -> list[Requirement]:
    project = PROJECT["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def locked() -> dict[str, list[tuple[str, Marker | None, str]]]:
    """Each package of the lock: its pins, each (version, marker, the entry's text)."""
    entries: dict[str, list[tuple[str, Marker | None, str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", LOCK):
        first = entry.split("\\", 1)[0].strip()
        if not first or first.startswith("#"):
            continue
        requirement = Requirement(first)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", first
        name = canonicalize_name(requirement.name)
        entries.setdefault(name, []).append((specifier.version, requirement.marker, entry))
    return entries


def pinned_here(name: str) -> str | None:
    """The version the lock pins for `name` on this interpreter and platform."""
    for pin, marker, _ in locked().get(canonicalize_name(name), []):
        if marker is None or marker.evaluate():
            return pin
    return None


def module_index() -> dict[str, set[str]]:
    """Every module path the installed distributions hold ("a.b" for a/b.py or
    a/b/__init__.py, and each of its parents), with the distributions holding it: a
    namespace package (opentelemetry) is held by many, its modules by one each."""
    index: dict[str, set[str]] = {}
    for distribution in distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        for file in distribution.files or []:
            parts = file.parts
            if not parts or not parts[-1].endswith((".py", ".so", ".pyi")):
                continue
            stem = parts[-1].split(".")[0]
            dotted = [*parts[:-1], stem] if stem != "__init__" else list(parts[:-1])
            for n in range(1, len(dotted) + 1):
                index.setdefault(".".join(dotted[:n]), set()).add(name)
    return index


def imported_distributions(*packages: str) -> dict[str, set[str]]:
    """The distributions the modules under `packages` import, each with its importers."""
    index = module_index()
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # `from a import b`: module a.b if there is one, else a's name b.
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ("app", "schema", "migrations"):
                        continue
                    parts = name.split(".")
                    holders = next(
                        (
                            index[".".join(parts[:n])]
                            for n in range(len(parts), 0, -1)
                            if ".".join(parts[:n]) in index
                        ),
                        {f"<no distribution: {top}>"},
                    )
                    # Any one declared holder will do (a namespace package's top).
                    key = " | ".join(sorted(holders))
                    found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


def test_what_the_service_imports_is_declared() -> None:
    direct = {canonicalize_name(r.name) for r in declared()}
    undeclared = {
        holders: sorted(importers)
        for holders, importers in imported_distributions("app", "schema", "migrations").items()
        if not set(holders.split(" | ")) & direct
    }
    assert undeclared == {}, "declare these in pyproject.toml's dependencies"


def test_every_declared_dependency_is_pinned_and_locked_at_its_pin() -> None:
    build = [Requirement(line) for line in PROJECT["build-system"]["requires"]]
    for requirement in [*declared(*PROJECT["project"]["optional-dependencies"]), *build]:
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{requirement}: pin it (==) in pyproject.toml"
        pins = {pin for pin, _, _ in locked().get(canonicalize_name(requirement.name), [])}
        assert pins == {specifier.version}, f"{requirement}: the lock has {pins}: scripts/lock"


def test_the_lock_pins_every_package_with_hashes() -> None:
    for name, pins in locked().items():
        for pin, _, entry in pins:
            assert "--hash=sha256:" in entry, f"{name}=={pin} has no hash"


def test_the_venv_holds_what_the_lock_pins() -> None:
    lock = locked()
    installed = {
        canonicalize_name(d.metadata["Name"])
        for d in distributions()
        if canonicalize_name(d.metadata["Name"]) != "bettercompute-pools"
    }
    assert installed - set(lock) == set(), "installed but not locked: scripts/bootstrap"
    for name in lock:
        pin = pinned_here(name)
        if pin is not None:
            assert version(name) == pin, name
