"""Fleet files are bounded in size, nesting and alias expansion (issue 19, item 14;
app/fleet/document.py): a file past a bound is INVALID_INPUT naming its line and column,
refused before anything is written, and a valid file, aliases and all, still applies."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from app.errors import InvalidInput
from app.fleet.document import EVENT_SOURCES, FileBounds, load_yaml
from app.fleet.schema import read_fleet
from tests.test_cli import BIN, out, run
from tests.test_cli_fleet import FLEET

# Each file as an attacker would write it; none is anywhere near valid.
ATTACKS = {
    # 100,000 nested flow sequences: the composer's recursion overflowed (INTERNAL).
    "deep-flow.yaml": lambda: "tenants: " + "[" * 100_000 + "]" * 100_000 + "\n",
    # 1,000 nested block mappings, 0.5 MB.
    "deep-block.yaml": lambda: "".join(" " * i + "a:\n" for i in range(1_000)),
    "deep.json": lambda: '{"tenants": ' + "[" * 100_000 + "]" * 100_000 + "}",
    # A million aliases, 4 MB: refused by its size before a byte of it is parsed.
    "million-aliases.yaml": lambda: (
        "tenants: &a [{id: x}]\nsites: [" + ", ".join(["*a"] * 1_000_000) + "]\n"
    ),
    # The same idea within the size bound: 200,000 aliases, 0.8 MB.
    "aliases.yaml": lambda: "tenants: &a [{id: x}]\nsites: [" + ", ".join(["*a"] * 200_000) + "]\n",
    # Billion laughs: 370 bytes standing for 10^10 nodes.
    "laughs.yaml": lambda: (
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
            for i in range(9)
        )
    ),
    # 20 MB of plain, valid-looking YAML.
    "big.yaml": lambda: "tenants:\n" + "".join(f"  - id: t{i}\n" for i in range(1_200_000)),
}
# What each is refused for, and where.
REFUSED = {
    "deep-flow.yaml": "line 1, column ",
    "deep-block.yaml": "line 33, column 33: nested deeper than 32 levels",
    "deep.json": "line 1, column 44: nested deeper than 32 levels",
    "million-aliases.yaml": "line 2, column 1048555: the file is larger than 1048576 bytes",
    "aliases.yaml": "line 2, column 10009: aliases repeat more than 10000 nodes",
    "laughs.yaml": "line 4, column 36: aliases repeat more than 10000 nodes",
    "big.yaml": "line 70647, column 3: the file is larger than 1048576 bytes",
}


def apply_file(url: str, path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [str(BIN), "apply", "-f", str(path)],
        env={**os.environ, "BETTERCOMPUTE_DATABASE_URL": url, **env},
        capture_output=True,
        text=True,
        timeout=60,  # a generous bound: before the fix, these ran past 60 s or failed INTERNAL
        check=False,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attack_file_is_invalid_input_naming_its_place(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(ATTACKS[name]())
    store = tmp_path / "fleet.db"
    done, took = apply_file(f"sqlite+aiosqlite:///{store}", path)
    print(f"{name}: {path.stat().st_size} bytes, refused in {took:.2f} s (process included)")
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr[:2000]
    assert done.stderr.startswith(f"bettercompute: INVALID_INPUT: {path}: "), done.stderr
    assert REFUSED[name] in done.stderr, done.stderr
    assert not store.exists()  # refused before the database was opened


def test_the_bounds_are_settings(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    url = f"sqlite+aiosqlite:///{tmp_path / 'fleet.db'}"
    for variable, place in (
        ("BETTERCOMPUTE_FLEET_FILE_MAX_DEPTH", "line 3, column 5: nested deeper than 2"),
        ("BETTERCOMPUTE_FLEET_FILE_MAX_BYTES", "line 2, column 2: the file is larger than 2"),
    ):
        done, _ = apply_file(url, path, **{variable: "2"})
        assert done.returncode == 1 and place in done.stderr, (variable, done.stderr)


def test_a_valid_file_with_aliases_still_applies(fresh_database_url: str, tmp_path: Path) -> None:
    """Aliases within the bound are YAML as usual: one quota written once, used twice."""
    text = (
        FLEET.replace("quota: {gpu: 64}", "quota: &big {gpu: 64}")
        .replace("  - {id: globex}\n", "  - {id: globex}\n  - {id: acme-lab}\n")
        .replace("priority: 10}\n", "priority: 10}\n      - {tenant: acme-lab, quota: *big}\n")
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    run(fresh_database_url, "db", "upgrade")
    applied = out(fresh_database_url, "apply", "-f", str(path))
    offers = [e for e in applied["created"] if e["kind"] == "offer"]
    assert sorted(o["to"] for o in offers) == ["acme-lab", "globex"]


def test_the_place_and_the_cycle(tmp_path: Path) -> None:
    """In process: the details carry line and column; an alias inside its own anchor (a
    cycle safe_load would build) is refused where it stands."""
    with pytest.raises(InvalidInput) as raised:
        read_fleet("tenants: &t [*t]\n", "cycle.yaml")
    assert raised.value.details == {"field": "file", "line": 1, "column": 14}
    assert "alias inside the node it names" in raised.value.message
    # An alias that repeats a deep node counts its depth where it is used.
    deep = "a: &d " + "[" * 20 + "]" * 20 + "\nb: [[[[[[[[[[[[[*d]]]]]]]]]]]]]\n"
    with pytest.raises(InvalidInput, match="line 2, column 17: nested deeper than 32"):
        read_fleet(deep, "deep-alias.yaml")
    # Bytes are counted, not characters.
    with pytest.raises(InvalidInput, match="larger than 8 bytes"):
        read_fleet("a: ééééé", "utf8.yaml", FileBounds(max_bytes=8))


@pytest.mark.parametrize("events", EVENT_SOURCES, ids=lambda e: e.__name__)
def test_both_event_sources_compose_alike(events: type) -> None:
    """libyaml's events and PyYAML's own (used where PyYAML has no libyaml) give safe_load's
    document, and meet the bounds at the same place."""
    import yaml

    bounds = FileBounds()
    assert load_yaml(FLEET, "fleet.yaml", bounds, events) == yaml.safe_load(FLEET)
    for name in ("deep-block.yaml", "aliases.yaml", "laughs.yaml"):
        with pytest.raises(InvalidInput) as raised:
            load_yaml(ATTACKS[name](), name, bounds, events)
        assert REFUSED[name] in raised.value.message, (name, raised.value.message)
