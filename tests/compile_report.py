"""Opt-in pytest plugin: where the suite's compile time goes, test by test and program by program.

Usage (one JSON-lines file per xdist worker, then a summary)::

    JAXSPEC_TEST_COMPILE_LOG=/tmp/clog .venv/bin/python -m pytest -p tests.compile_report ...
    .venv/bin/python -m tests.compile_report /tmp/clog

Each record is one event of JAX's own instrumentation (``jax.monitoring`` durations for tracing,
lowering and the backend compile, which includes loading a program from the persistent cache;
the persistent cache's hit / miss log lines), tagged with the running test's node id. Nothing is
recorded in CLI subprocesses the tests start.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

_LOG_ENV = "JAXSPEC_TEST_COMPILE_LOG"
_records: list[dict] = []
_current = {"test": "<collect>"}
_CACHE_LINE = re.compile(r"(hit|MISS) for '([^']*)' with key '?([^' ]*)", re.IGNORECASE)
_COMPILING = re.compile(
    r"^Compiling (\S+) with global shapes and types (.*)\. Argument mapping", re.S
)


class _CacheLines(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        m = _CACHE_LINE.search(msg)
        if m:
            kind = "hit" if m.group(1).lower() == "hit" else "miss"
            _records.append(
                {"test": _current["test"], "event": kind, "fun": m.group(2), "key": m.group(3)}
            )
            return
        m = _COMPILING.match(msg)
        if m:
            _records.append(
                {"test": _current["test"], "event": "avals", "fun": m.group(1), "avals": m.group(2)}
            )


def _on_duration(event: str, duration: float, **kw) -> None:
    # tracing, lowering and the backend compile (not the cache's "compile time saved")
    if event.startswith("/jax/core/compile/"):
        _records.append(
            {"test": _current["test"], "event": event, "fun": kw.get("fun_name", ""), "s": duration}
        )


def pytest_configure(config):
    if not os.environ.get(_LOG_ENV):
        return
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    for name in ("jax._src.compiler", "jax._src.interpreters.pxla"):
        log = logging.getLogger(name)
        log.setLevel(logging.DEBUG)
        log.addHandler(_CacheLines(level=logging.DEBUG))
        log.propagate = False  # keep the DEBUG lines out of pytest's captured logs


def pytest_runtest_logstart(nodeid, location):
    _current["test"] = nodeid


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get(_LOG_ENV)
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(out) / f"{worker}-{os.getpid()}.jsonl", "w") as f:
        for r in _records:
            f.write(json.dumps(r) + "\n")


def _cache_name(fun: str) -> str:
    """``jit(name)`` (the compile events) -> ``jit_name`` (the cache's log lines)."""
    return fun.replace("jit(", "jit_", 1).removesuffix(")") if fun.startswith("jit(") else fun


def summarise(folder: str | os.PathLike, top: int = 40) -> str:
    """The report: compile seconds (misses) per test file, per test and per program name."""
    rows = [
        json.loads(line)
        for p in sorted(Path(folder).glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    backend = [r for r in rows if r["event"].endswith("backend_compile_duration")]
    misses = {(r["test"], r["fun"]) for r in rows if r["event"] == "miss"}
    by_test: dict = defaultdict(float)
    by_file: dict = defaultdict(float)
    by_fun: dict = defaultdict(lambda: [0, 0.0])
    other: dict = defaultdict(float)
    for r in rows:
        if r["event"].startswith("/jax/core/compile/") and "backend_compile" not in r["event"]:
            other[r["test"].split("::")[0]] += r["s"]
    for r in backend:
        by_test[r["test"]] += r["s"]
        by_file[r["test"].split("::")[0]] += r["s"]
        f = by_fun[r["fun"]]
        f[0] += 1
        f[1] += r["s"]
    n_miss = sum(r["event"] == "miss" for r in rows)
    n_hit = sum(r["event"] == "hit" for r in rows)
    lines = [
        f"backend compiles (incl. cache loads): {len(backend)}, {sum(by_test.values()):.0f} s; "
        f"persistent cache misses {n_miss} ({len(misses)} test/program pairs), hits {n_hit}; "
        f"tracing + lowering {sum(other.values()):.0f} s",
        "",
        "| file | backend compile s | trace + lower s |",
        "|---|---|---|",
    ]
    for k, v in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {k} | {v:.1f} | {other.get(k, 0.0):.1f} |")
    lines += ["", "| test | backend compile s |", "|---|---|"]
    for k, v in sorted(by_test.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {k} | {v:.1f} |")
    keys: dict = defaultdict(set)  # persistent-cache keys (distinct programs) by name
    shapes: dict = defaultdict(set)  # argument shapes by name
    for r in rows:
        if r["event"] == "miss":
            keys[r["fun"]].add(r["key"])
        elif r["event"] == "avals":
            shapes[_cache_name(r["fun"])].add(r["avals"])
    lines += [
        "",
        "| program | compiles | s | distinct programs | distinct argument shapes |",
        "|---|---|---|---|---|",
    ]
    for k, (n, s) in sorted(by_fun.items(), key=lambda kv: -kv[1][1])[:top]:
        name = _cache_name(k)
        lines.append(f"| {k} | {n} | {s:.1f} | {len(keys[name])} | {len(shapes[name])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
