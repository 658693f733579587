"""Memory maps held by a ``dflash`` suite over several prompt sets, with and without
:func:`jaxspec.bench.ar_suite.free_programs` between the sets.

Every XLA CPU program keeps memory maps of its own; the kernel allows ``vm.max_map_count``
per process (65,530 here), and a three-set ``--suite dflash`` run with twelve rows per set
aborted in its third set with ``LLVM ERROR: Unable to allocate section memory``.

    python benchmarks/probes/suite-maps/probe.py keep   # programs kept (before the fix)
    python benchmarks/probes/suite-maps/probe.py free   # freed after each set

Prints, after each set: the process's memory-map count (``/proc/self/maps`` lines) and the
compiled programs held (:mod:`jaxspec.core.runtime`). Timings are not the point: the rows are
tiny (2 prompts, 32 tokens).

Measured on 2026-11-28, 2-core AMD EPYC, jax 0.10.2 (beside a training run; counts only):

    [keep] start: 565 maps
    [keep] [dflash] prompt set humaneval: 2 prompts: 570 maps, 0 programs
    [keep] [dflash] prompt set mt-bench: 2 prompts: 14887 maps, 8 programs
    [keep] [dflash] prompt set news: 2 prompts: 28406 maps, 16 programs
    [keep] end: 57288 maps, 32 programs
    [free] start: 576 maps
    [free] [dflash] prompt set humaneval: 2 prompts: 578 maps, 0 programs
    [free] [dflash] freed 8 compiled programs: 718 maps, 0 programs
    [free] [dflash] prompt set mt-bench: 2 prompts: 718 maps, 0 programs
    [free] [dflash] freed 16 compiled programs: 751 maps, 0 programs
    [free] [dflash] prompt set news: 2 prompts: 751 maps, 0 programs
    [free] [dflash] freed 16 compiled programs: 753 maps, 0 programs
    [free] end: 1299 maps, 0 programs

About 1,700 maps per program: the kernel's 65,530 allow some 35 programs per process.
"""

import sys

import jaxspec.bench.dflash as suite
from jaxspec.bench.machine import memory_maps
from jaxspec.causal.dflash import load_drafter
from jaxspec.core import runtime
from models.registry import load_model


def maps() -> int:
    return memory_maps()[0]


def main(arm: str) -> None:
    if arm not in ("keep", "free"):
        raise SystemExit("usage: probe.py keep|free")
    if arm == "keep":
        suite.free_programs = lambda log=None: 0
    model, params, tok, _ = load_model("smollm2-135m-instruct")
    drafters = [
        load_drafter(f"checkpoints/dflash-smollm2-135m{s}/drafter.safetensors")
        for s in ("-b4", "-b8", "")
    ]
    print(f"[{arm}] start: {maps()} maps", flush=True)

    def log(m):
        if "prompt set" in m or "freed" in m:
            print(f"[{arm}] {m}: {maps()} maps, {len(runtime._EXECUTABLES)} programs", flush=True)

    suite.run_dflash_suite(
        (model, params),
        drafters,
        tok,
        sets=("humaneval", "mt-bench", "news"),
        limit=2,
        max_new_tokens=32,
        verify_lengths=(3, 7),
        cost_reps=1,
        progress=False,
        log=log,
    )
    print(f"[{arm}] end: {maps()} maps, {len(runtime._EXECUTABLES)} programs", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "free")
