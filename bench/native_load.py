"""A native HTTP load generator for the benchmarks, installed on first use.

`wrk` (Debian's package, installed with apt-get when missing: the benchmark runs as root
here, or with `sudo -n`) is preferred; when apt cannot install it, `autocannon` from npm
(installed into a cache directory, never into the repository). Both are closed-loop: each
connection sends its next request when the previous answer arrives, so the rate achieved is
the rate the server sustains at that concurrency ("asked: saturate").

A run sends a rotating list of requests (wrk: a generated Lua script whose `request()` hook
cycles through them, its `done()` hook printing the counts and latency percentiles as JSON;
autocannon: its `requests` list, cycled by each connection).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

APT_LOCK_TIMEOUT_S = 120
AUTOCANNON_VERSION = "8.0.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bettercompute-bench"


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: str | None = None


@dataclass(frozen=True)
class LoadResult:
    requests: int  # answers received within the run
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int  # socket errors, timeouts and non-2xx answers
    cpu_s: float  # the generator's own user + system CPU over the run

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class LoadGenerator(Protocol):
    @property
    def name(self) -> str: ...

    def run(
        self,
        base_url: str,
        requests: list[HttpRequest],
        *,
        connections: int,
        threads: int,
        seconds: float,
        timeout_s: float = 30.0,
    ) -> LoadResult: ...


def _say(message: str) -> None:
    print(f"native_load: {message}", file=sys.stderr, flush=True)


def _as_root(command: list[str]) -> list[str] | None:
    if os.geteuid() == 0:
        return command
    if shutil.which("sudo"):
        return ["sudo", "-n", *command]
    return None


def _apt_install(package: str) -> bool:
    apt = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"]
    install = _as_root([*apt, "install", "-y", "-q", package])
    update = _as_root([*apt, "update"])
    if install is None or update is None or not shutil.which("apt-get"):
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for before in ([], [update]):  # the package lists may be missing or stale: update once
        for command in before:
            subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=False)
        _say(f"installing {package}: {' '.join(install)}")
        done = subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False)
        if done.returncode == 0:
            return True
    return False


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run_child(
    command: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> tuple[str, float]:
    """A generator's output and its CPU seconds (the rusage of children waited for: the
    servers under test are not waited for until they stop)."""
    before = _children_cpu_s()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    cpu_s = _children_cpu_s() - before
    if done.returncode != 0 or done.stderr.strip():  # wrk reports a Lua error and goes on
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr or done.stdout}")
    return done.stdout, cpu_s


def _marked_json(output: str, marker: str) -> dict[str, float]:
    for line in output.splitlines():
        if line.startswith(marker):
            found: dict[str, float] = json.loads(line[len(marker) :])
            return found
    raise RuntimeError(f"no {marker.strip()} line in the generator's output:\n{output}")


# --- wrk --------------------------------------------------------------------------------

_WRK_MARKER = "BENCH_WRK "
_WRK_DONE = r"""
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p99_us": %d, '
    .. '"mean_us": %.1f}\n',
    "__MARKER__", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
""".replace("__MARKER__", _WRK_MARKER)


def _lua_string(value: str) -> str:
    """A Lua long bracket string holding `value` verbatim."""
    level = 0
    while f"]{'=' * level}]" in value:
        level += 1
    eq = "=" * level
    # A newline right after the opening bracket is dropped by Lua: keep one if present.
    return f"[{eq}[\n{value}]{eq}]" if value.startswith("\n") else f"[{eq}[{value}]{eq}]"


def _lua_table(headers: dict[str, str]) -> str:
    pairs = (f"[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in headers.items())
    return "{" + ", ".join(pairs) + "}"


def wrk_script(requests: list[HttpRequest]) -> str:
    """One request: wrk's static request (built once per thread). Several: formatted once in
    each thread's `init`, then handed out in turn by `request()`."""
    if len(requests) == 1:
        (one,) = requests
        lines = [
            f"wrk.method = {_lua_string(one.method)}",
            f"wrk.path = {_lua_string(one.path)}",
            f"wrk.headers = {_lua_table(one.headers)}",
        ]
        if one.body is not None:
            lines.append(f"wrk.body = {_lua_string(one.body)}")
        return "\n".join(lines) + "\n" + _WRK_DONE
    specs = ",\n".join(
        "{"
        + ", ".join(
            [
                _lua_string(r.method),
                _lua_string(r.path),
                _lua_table(r.headers),
                "nil" if r.body is None else _lua_string(r.body),
            ]
        )
        + "}"
        for r in requests
    )
    return f"""
local specs = {{
{specs}
}}
local formatted = {{}}
local turn = 0

function init(args)
  for i, s in ipairs(specs) do
    formatted[i] = wrk.format(s[1], s[2], s[3], s[4])
  end
end

function request()
  turn = turn % #formatted + 1
  return formatted[turn]
end
{_WRK_DONE}"""


@dataclass(frozen=True)
class Wrk:
    executable: str
    name: str = "wrk"

    def run(
        self,
        base_url: str,
        requests: list[HttpRequest],
        *,
        connections: int,
        threads: int,
        seconds: float,
        timeout_s: float = 30.0,
    ) -> LoadResult:
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write(wrk_script(requests))
        try:
            command = [
                self.executable,
                f"-t{threads}",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                f"--timeout={round(timeout_s)}s",
                "-s",
                script.name,
                base_url,
            ]
            output, cpu_s = _run_child(command, seconds + timeout_s + 30)
        finally:
            os.unlink(script.name)
        found = _marked_json(output, _WRK_MARKER)
        return LoadResult(
            requests=int(found["requests"]),
            seconds=found["duration_us"] / 1e6,
            p50_ms=found["p50_us"] / 1000,
            p99_ms=found["p99_us"] / 1000,
            mean_ms=found["mean_us"] / 1000,
            errors=int(found["errors"]),
            cpu_s=cpu_s,
        )


def ensure_wrk() -> Wrk | None:
    found = shutil.which("wrk")
    if found is None and _apt_install("wrk"):
        found = shutil.which("wrk")
    return None if found is None else Wrk(found)


# --- autocannon -------------------------------------------------------------------------

_AUTOCANNON_MARKER = "BENCH_AUTOCANNON "
_AUTOCANNON_RUNNER = """
const autocannon = require(process.env.BENCH_AUTOCANNON_MODULE);
const spec = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
autocannon(spec, (err, r) => {
  if (err) { console.error(err); process.exit(1); }
  const errors = r.errors + r.timeouts + r.non2xx;
  console.log("__MARKER__" + JSON.stringify({
    requests: r.requests.total, duration_s: r.duration, errors: errors,
    p50_ms: r.latency.p50, p99_ms: r.latency.p99, mean_ms: r.latency.mean,
  }));
});
""".replace("__MARKER__", _AUTOCANNON_MARKER)


@dataclass(frozen=True)
class Autocannon:
    node: str
    module: Path
    name: str = "autocannon"

    def run(
        self,
        base_url: str,
        requests: list[HttpRequest],
        *,
        connections: int,
        threads: int,
        seconds: float,
        timeout_s: float = 30.0,
    ) -> LoadResult:
        # autocannon runs on one thread: `threads` does not apply.
        spec = {
            "url": base_url,
            "connections": connections,
            "duration": max(1, round(seconds)),
            "timeout": round(timeout_s),
            "requests": [
                {"method": r.method, "path": r.path, "headers": r.headers}
                | ({} if r.body is None else {"body": r.body})
                for r in requests
            ],
        }
        runner = CACHE / "autocannon-runner.js"
        runner.parent.mkdir(parents=True, exist_ok=True)
        runner.write_text(_AUTOCANNON_RUNNER)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
            json.dump(spec, file)
        try:
            env = {**os.environ, "BENCH_AUTOCANNON_MODULE": str(self.module)}
            output, cpu_s = _run_child([self.node, str(runner), file.name], seconds + 60, env)
        finally:
            os.unlink(file.name)
        found = _marked_json(output, _AUTOCANNON_MARKER)
        return LoadResult(
            requests=int(found["requests"]),
            seconds=found["duration_s"],
            p50_ms=found["p50_ms"],
            p99_ms=found["p99_ms"],
            mean_ms=found["mean_ms"],
            errors=int(found["errors"]),
            cpu_s=cpu_s,
        )


def ensure_autocannon() -> Autocannon | None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return None
    prefix = CACHE / "node"
    module = prefix / "node_modules" / "autocannon"
    if not module.is_dir():
        prefix.mkdir(parents=True, exist_ok=True)
        package = f"autocannon@{AUTOCANNON_VERSION}"
        _say(f"installing {package} into {prefix}")
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), package],
            stdout=subprocess.DEVNULL,
            check=False,
        )
    return Autocannon(node, module) if module.is_dir() else None


def ensure_generator(prefer: str = "wrk") -> LoadGenerator:
    """wrk, else autocannon; `prefer="autocannon"` tries autocannon first."""
    order = [ensure_wrk, ensure_autocannon]
    if prefer == "autocannon":
        order.reverse()
    for ensure in order:
        generator = ensure()
        if generator is not None:
            return generator
    raise GeneratorMissing("neither wrk (apt-get) nor autocannon (npm) could be installed")


class GeneratorMissing(RuntimeError):
    pass
