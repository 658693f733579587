"""One prepared benchmark run for a lent accelerator: pack, unpack, verify, run plan.

A lent GPU machine has no network, receives the working tree plus at most 64 MiB per call
(:data:`CARRY_MAX_BYTES`, the tree included), gives back at most 8 files of at most 16 MiB,
and runs one command for at most 10 minutes. So everything the run needs is packed here on the
CPU machine (:func:`build_pack`) into an ignored folder, and the device run
(:func:`run_device_bench`) unpacks and checks it, then times every registered method
(:mod:`jaxspec.methods`) on the test vehicles within a time budget, writing each suite's
results as the suite ends and re-bundling them into one file under ``$OUT``.

The modules, by concern:

- :mod:`~jaxspec.bench.device.pack`: the pack format (parts, manifest, sha256, wheels, the
  returned JAX compilation cache);
- :mod:`~jaxspec.bench.device.plan`: the carry plan of a device session (which call carries
  which pack parts);
- :mod:`~jaxspec.bench.device.pages`: the result pages (each suite's json, markdown page
  and figure, the returned bundle, its collection);
- :mod:`~jaxspec.bench.device.vehicles`: the vehicles and prompts, and the pack that
  carries them;
- :mod:`~jaxspec.bench.device.run`: the staged run on the device.

This package re-exports the names the CLI (``scripts.device_bench``) and the tests use.
"""

from jaxspec.bench.device.pack import (
    DEVICE_WHEELS,
    JAX_CACHE_ARTIFACT,
    MANIFEST,
    PACK_DIR,
    PACK_FORMAT,
    PROMPTS,
    MiB,
    PackError,
    download_wheels,
    export_jax_cache,
    extract_jax_cache,
    join_returned_cache,
    read_manifest,
    split_file,
    stage_parts,
    unpack,
    verify_pack,
)
from jaxspec.bench.device.pages import SUITES, collect, coverage, parse_run_log
from jaxspec.bench.device.plan import (
    CARRY_MAX_BYTES,
    CARRY_MAX_PATHS,
    carry_plan,
    session_plan,
)
from jaxspec.bench.device.run import (
    Budget,
    RunSettings,
    _entries,
    answer_degeneracy,
    run_device_bench,
    run_methods_stage,
    stage_plan,
)
from jaxspec.bench.device.vehicles import (
    _REAL_FAMILY,
    REAL_VEHICLES,
    Vehicle,
    build_pack,
    dflash_drafter,
    load_vehicles,
    smoke_prompts,
    smoke_vehicles,
    write_manifest,
)

__all__ = [
    "Budget",
    "CARRY_MAX_BYTES",
    "CARRY_MAX_PATHS",
    "DEVICE_WHEELS",
    "JAX_CACHE_ARTIFACT",
    "MANIFEST",
    "MiB",
    "PACK_DIR",
    "PACK_FORMAT",
    "PROMPTS",
    "PackError",
    "REAL_VEHICLES",
    "RunSettings",
    "SUITES",
    "Vehicle",
    "_REAL_FAMILY",
    "_entries",
    "answer_degeneracy",
    "build_pack",
    "carry_plan",
    "collect",
    "coverage",
    "dflash_drafter",
    "download_wheels",
    "export_jax_cache",
    "extract_jax_cache",
    "join_returned_cache",
    "load_vehicles",
    "parse_run_log",
    "read_manifest",
    "run_device_bench",
    "run_methods_stage",
    "session_plan",
    "smoke_prompts",
    "smoke_vehicles",
    "split_file",
    "stage_parts",
    "stage_plan",
    "unpack",
    "verify_pack",
    "write_manifest",
]
