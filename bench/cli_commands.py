"""How fast `bettercompute` admin commands answer on the embedded default.

    .venv/bin/python -m bench.cli_commands [--runs 20]

Runs each command RUNS times as separate processes (as an operator types them) against
an SQLite file that already exists and is at head, and prints the median wall time next
to `python -c pass` (the interpreter's own start) and the 0.3 s target. Then it applies
a fleet file of 100 tenants with a caller each (typed one command at a time that is 200
commands) and applies it again (nothing to change). The load average is printed because
the figures are wall times on a shared machine; `cpu` (user + system, median) is what a
command costs by itself, whatever else the cores are doing.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BIN = str(Path(sys.executable).with_name("bettercompute"))
TARGET_S = 0.3


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run."""
    cpu, start = _cpu(), time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return elapsed, _cpu() - cpu


def _timed(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    return _run(argv, cwd, env)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    env = {k: v for k, v in os.environ.items() if k != "BETTERCOMPUTE_DATABASE_URL"}
    with tempfile.TemporaryDirectory(prefix="bc-cli-bench-") as cwd:
        _timed([BIN, "db", "upgrade"], cwd, env)  # the embedded default, once
        _timed([BIN, "tenant", "create", "acme"], cwd, env)
        commands: list[tuple[str, list[list[str]]]] = [
            ("python -c pass", [[sys.executable, "-c", "pass"]] * runs),
            ("tenant create", [[BIN, "tenant", "create", f"t{i}"] for i in range(runs)]),
            (
                "caller create",
                [[BIN, "caller", "create", "--tenant", "acme", "--role", "admin"]] * runs,
            ),
            (
                "site create",
                [[BIN, "site", "create", "--tenant", "acme", "--kind", "custom", "--region", "eu"]]
                * runs,
            ),
        ]
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {runs} runs each")
        print(f"{'command':<16} {'median':>8} {'min':>8} {'cpu':>8}   target (median wall)")
        for label, argvs in commands:
            runs_ = [_run(argv, cwd, env) for argv in argvs]
            times = [wall for wall, _ in runs_]
            cpu = statistics.median(c for _, c in runs_)
            median = statistics.median(times)
            verdict = (
                ""
                if label.startswith("python")
                else (f"< {TARGET_S} s {'met' if median < TARGET_S else 'MISSED'}")
            )
            print(f"{label:<16} {median:>7.3f}s {min(times):>7.3f}s {cpu:>7.3f}s   {verdict}")

        fleet = {
            "tenants": [{"id": f"customer-{i:03d}"} for i in range(100)],
            "callers": [
                {"tenant": f"customer-{i:03d}", "name": "admin", "role": "admin"}
                for i in range(100)
            ],
        }
        path = Path(cwd) / "fleet.yaml"
        path.write_text(yaml.safe_dump(fleet))
        first = _timed([BIN, "apply", "-f", str(path)], cwd, env)
        again = _timed([BIN, "apply", "-f", str(path)], cwd, env)
        print(f"apply 100 tenants + 100 callers: {first:.2f}s; again (no changes): {again:.2f}s")
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
