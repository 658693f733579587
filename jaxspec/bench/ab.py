"""The A/B protocol of the probe scripts under ``benchmarks/probes/``: two arms timed in
alternating order (:func:`ab_seconds`, :func:`ab_table`), arms that differ in traced code
compiled apart (:func:`compile_arms`, :func:`run_arm`), and their markdown output
(:func:`emit_lines`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from jaxspec.core.runtime import clear_compiled, compiled_snapshot, use_compiled


def ab_seconds(
    run: Callable[[str, Any], Any], arms: Sequence[str], inputs: Sequence, reps: int
) -> tuple[dict[str, list[float]], list[float]]:
    """The two-arm A/B protocol of the ``results/`` probe scripts: for every input, ``reps``
    rounds that time ``run(arm, input)`` once per arm, the arms' order alternating from round
    to round and input to input (compile first: nothing here is untimed).

    Returns:
      ``({arm: wall-clock seconds of every call}, per input: the first arm's median seconds
      over the second's, i.e. the second arm's speedup)``."""
    secs: dict[str, list[float]] = {a: [] for a in arms}
    ratios = []
    for i, x in enumerate(inputs):
        mine: dict[str, list[float]] = {a: [] for a in arms}
        for r in range(reps):
            for a in arms if (i + r) % 2 == 0 else arms[::-1]:
                t0 = time.perf_counter()
                run(a, x)
                mine[a].append(time.perf_counter() - t0)
        for a in arms:
            secs[a] += mine[a]
        ratios.append(statistics.median(mine[arms[0]]) / statistics.median(mine[arms[1]]))
    return secs, ratios


def compile_arms(
    arms: Sequence, switch: Callable[[Any], None], first_run: Callable[[Any], Any]
) -> tuple[dict, dict]:
    """The compile step of the ``results/`` A/B probes whose arms differ in the code they trace
    (a module constant, a wrapped function): per arm, ``switch(arm)``, drop every compiled
    program (:func:`jaxspec.core.runtime.clear_compiled`), call ``first_run(arm)`` (which
    compiles; untimed) and keep the compile cache. The last arm's switch stays in effect.

    Returns:
      ``({arm: first_run's result}, {arm: its executables})``; :func:`run_arm` runs an arm on
      its own executables."""
    outs, programs = {}, {}
    for arm in arms:
        switch(arm)
        clear_compiled()
        outs[arm] = first_run(arm)
        programs[arm] = compiled_snapshot()
    return outs, programs


def run_arm(programs: dict, arm, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``arm``'s executables (:func:`compile_arms`) as the compile
    cache, so the call runs the program that arm compiled."""
    use_compiled(programs[arm])
    return fn(*args, **kwargs)


def ab_table(
    secs: dict[str, list[float]],
    ratios: Sequence[float],
    label: str,
    name: Callable[[str], str] = str,
) -> list[str]:
    """Markdown lines of an :func:`ab_seconds` result: per arm the median and fastest seconds
    per call and the median of the per-input speedups (1.00x for the first arm)."""
    first = next(iter(secs))
    lines = [
        f"| {label} | seconds per prompt, median | fastest | median of per-prompt speedups |",
        "|---|---|---|---|",
    ]
    for a, t in secs.items():
        ratio = 1.0 if a == first else statistics.median(ratios)
        f = ".3f" if statistics.median(t) < 1 else ".2f"  # sub-second calls: milliseconds
        lines.append(f"| {name(a)} | {statistics.median(t):{f}} | {min(t):{f}} | {ratio:.2f}x |")
    return lines + ["", "per-prompt speedups: " + ", ".join(f"{r:.2f}" for r in ratios)]


def emit_lines(lines: Sequence[str], out: Optional[str] = None) -> None:
    """Print a probe's markdown ``lines`` and, with ``out``, write them to that file too (the
    one-off scripts under ``results/``)."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out:
        Path(out).write_text(text)
