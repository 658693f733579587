"""Everything a lent GPU needs, packed here; one command there runs every method.

On the CPU machine (network, the fetched weights)::

    python -m scripts.device_bench pack [--pack-dir device_pack] [--part-max-mib 60]
    python -m scripts.device_bench pack --smoke --pack-dir /tmp/p      # tiny random vehicles

``pack`` writes the SmolLM2 GGUF in parts of at most 60 MiB with their sha256, the wheels the
device image lacks (:data:`jaxspec.bench.device.DEVICE_WHEELS`, ``pip download``), the
prompts' token ids and a manifest; it prints the pack's size, the working tree's size and
the carry plan (which files travel in which device call; 64 MiB per call, tree included).

On the device (``make device-bench``; from the session, the device tool's ``run`` with
``command="PYTHONUNBUFFERED=1 python3 -m scripts.device_bench run --budget-s 540"``,
``carry=["device_pack"]``, ``timeout_s=600``, as one call when the plan fits one)::

    python -m scripts.device_bench run --budget-s 540 [--out-dir results/gpu] \\
        [--suite methods-causal methods-dllm methods-asarm peers projection] \\
        [--shapes papers|tiny] [--bundle $OUT/device-bench.tgz] [--stage-dir DIR]

``run`` verifies every part's sha256 (a corrupt part is a one-line error), joins and installs
them, runs the suites in order within the budget (compile included; a step that cannot finish
is skipped and its row says so), writes ``<suite>.json/.md/.png`` as each suite ends and
re-bundles them into one ``.tgz`` (default ``$OUT/device-bench.tgz`` where ``$OUT`` is set):
a cut-off run still returns what it measured. ``collect BUNDLE`` puts a returned bundle's
files into ``results/gpu``. ``--smoke`` (CPU, seconds) runs the same code on the tiny pack
and writes under ``<pack-dir>/results``. ``--suite projection --shapes tiny`` needs no pack.

``verify`` checks a pack; ``stage`` copies the parts present to ``--stage-dir`` (outside the
tree), for a plan of several calls; ``plan`` prints every device call a session makes when
the tree is over the 64 MiB a call carries: the untrack / restore commands, each call's
``carry`` list and command (docs/device.md). ``run`` keeps a JAX compilation cache and sends
it back under ``$OUT`` (``jax-cache.json`` + parts); ``pack --jax-cache-from DIR`` carries it
into the next run.

Exit code 2 with one ``error:`` line on bad input or a missing / corrupt pack.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _add_pack_parser(sub) -> None:
    """``pack``: weights, wheels and prompts (CPU machine)."""
    from jaxspec.bench.device import PACK_DIR

    p = sub.add_parser("pack", help="pack weights, wheels and prompts (CPU machine)")
    p.add_argument("--pack-dir", default=PACK_DIR)
    p.add_argument("--smoke", action="store_true", help="tiny random vehicles")
    p.add_argument("--part-max-mib", type=float, default=60.0)
    p.add_argument("--no-wheels", action="store_true", help="pack no wheels")
    p.add_argument(
        "--wheel-cache",
        default=".cache/device-wheels",
        help="where pip download keeps the wheels between packs",
    )
    p.add_argument("--gguf", default=None, help="the SmolLM2 GGUF (default: fetched preset)")
    p.add_argument(
        "--no-hf", action="store_true", help="smoke: no transformers copy of the causal vehicle"
    )
    p.add_argument(
        "--jax-cache-from",
        default=None,
        help="a JAX compilation cache a device run returned (the folder holding "
        "jax-cache.json and its jax-cache.tar.NN parts): packed as the optional artifact "
        "jax-cache, extracted into the run's cache",
    )
    p.add_argument("--jax-cache-max-mib", type=float, default=48.0)


def _add_run_parser(sub) -> None:
    """``run``: the suites (device)."""
    from jaxspec.bench.device import PACK_DIR, SUITES

    r = sub.add_parser("run", help="run the suites (device)")
    r.add_argument("--pack-dir", default=PACK_DIR)
    r.add_argument("--smoke", action="store_true", help="the tiny pack, CPU, seconds")
    r.add_argument(
        "--out-dir", default=None, help="default results/gpu (smoke: <pack-dir>/results)"
    )
    r.add_argument("--budget-s", type=float, default=540.0)
    r.add_argument("--suite", nargs="+", default=list(SUITES), choices=SUITES)
    r.add_argument(
        "--shapes",
        default=None,
        choices=("papers", "tiny"),
        help="projection shapes (default papers; smoke: tiny)",
    )
    r.add_argument(
        "--bundle",
        default=None,
        help="one .tgz of every result (default $OUT/device-bench.tgz if $OUT)",
    )
    r.add_argument(
        "--stage-dir",
        action="append",
        default=[],
        help="where earlier calls staged parts (repeatable)",
    )
    r.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="only these registered methods (their references always run)",
    )
    r.add_argument(
        "--jax-cache",
        default=None,
        help="the JAX compilation cache folder (default <first --stage-dir>/jax-cache, else "
        "/tmp/jaxspec-jax-cache; smoke: none); off: none",
    )
    r.add_argument(
        "--jax-cache-out",
        default=None,
        help="where the cache goes back, as jax-cache.json + jax-cache.tar.NN parts of at "
        "most 16 MiB (default $OUT if set); off: nowhere",
    )
    r.add_argument("--jax-cache-max-mib", type=float, default=48.0)
    r.add_argument(
        "--matmul-precision",
        default="highest",
        choices=("highest", "high", "default"),
        help="jax_default_matmul_precision for the run (default highest: float32 products "
        "in float32, so greedy rows compare like with like; default: the backend's TF32)",
    )
    r.add_argument(
        "--no-compile",
        action="store_true",
        help="transformers static-cache peer without torch.compile",
    )


def _add_small_parsers(sub) -> None:
    """``verify``, ``stage``, ``plan`` and ``collect``."""
    from jaxspec.bench.device import PACK_DIR

    v = sub.add_parser("verify", help="check a pack's sha256")
    v.add_argument("--pack-dir", default=PACK_DIR)
    v.add_argument("--stage-dir", action="append", default=[])
    s = sub.add_parser("stage", help="copy the parts present to --stage-dir")
    s.add_argument("--pack-dir", default=PACK_DIR)
    s.add_argument("--stage-dir", default="/tmp/jaxspec-pack")
    pl = sub.add_parser(
        "plan", help="print the device calls a session makes (carry lists and commands)"
    )
    pl.add_argument("--pack-dir", default=PACK_DIR)
    pl.add_argument("--stage-dir", default="/tmp/stage")
    pl.add_argument("--budget-s", type=float, default=540.0)
    c = sub.add_parser("collect", help="extract a returned bundle into results/gpu")
    c.add_argument("bundle")
    c.add_argument("--out-dir", default="results/gpu")
    c.add_argument(
        "--log",
        default=None,
        help="the run's printed log: each suite's share and how every suite ended go into "
        "its .json / .md",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.device_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_pack_parser(sub)
    _add_run_parser(sub)
    _add_small_parsers(sub)
    return ap


def _plan_lines(
    manifest: dict, pack: str, stage_dir: str = "/tmp/stage", budget_s: float = 540.0
) -> list[str]:
    """The whole multi-call plan a session follows (:func:`jaxspec.bench.device.
    session_plan`), as lines: the untrack commands when the tree is over the limit, each
    call's ``carry`` list and command, the restore commands, and what to do with what comes
    back."""
    from jaxspec.bench.device import CARRY_MAX_BYTES, MiB, session_plan

    plan = session_plan(manifest, REPO, pack=pack, stage_dir=stage_dir, budget_s=budget_s)
    cache = [a for a in manifest["artifacts"] if a.get("kind") == "jax-cache"]
    lines = [
        f"[plan] pack {manifest['total_bytes'] / MiB:.1f} MiB"
        + (f" (a JAX cache of {cache[0]['size'] / MiB:.1f} MiB included)" if cache else "")
        + f"; the working tree that travels {plan['tree_bytes'] / MiB:.1f} MiB; a device call "
        f"carries {CARRY_MAX_BYTES / MiB:.0f} MiB with the tree, at most 8 paths"
    ]
    if not plan["fits"]:
        return lines + [f"[plan] no plan fits: {plan['reason']}"]
    if plan["untrack"]:
        lines += [
            f"[plan] the tree is over the limit: untrack checkpoints/ and results/ first "
            f"(the tree then travels {plan['untracked_tree_bytes'] / MiB:.1f} MiB); nobody "
            "may commit until they are restored:",
            *[f"    {c}" for c in plan["untrack"]],
        ]
    n = len(plan["calls"])
    for i, c in enumerate(plan["calls"], 1):
        lines += [
            f"[plan] call {i} of {n}: {c['what']} ({c['bytes'] / MiB:.1f} MiB with the tree; "
            f"timeout_s {c['timeout_s']})",
            f"    carry: {json.dumps(c['carry'])}",
            f"    command: {c['command']}",
        ]
    if n > 1:
        lines.append(
            "[plan] the calls must follow each other on the same warm machine (stage copies "
            f"its parts to {stage_dir}, which a fresh machine lacks); save each reply's "
            "output_tail"
        )
    if plan["restore"]:
        lines += ["[plan] after the last call, restore:", *[f"    {c}" for c in plan["restore"]]]
    lines += [
        "[plan] then: python -m scripts.device_bench collect FILES_AT/device-bench.tgz "
        "[--log the run call's saved output]",
        "[plan] the next pack takes the returned cache: python -m scripts.device_bench pack "
        "--part-max-mib 56 --jax-cache-from FILES_AT",
    ]
    return lines


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.bench import device
    from jaxspec.bench.projection import ProjectionError

    log = lambda m: print(m, flush=True)  # noqa: E731
    try:
        if args.cmd == "pack":
            wheels = []
            if not args.no_wheels and not args.smoke:
                wheels = device.download_wheels(device.DEVICE_WHEELS, REPO / args.wheel_cache)
            m = device.build_pack(
                Path(args.pack_dir),
                smoke=args.smoke,
                part_max=int(args.part_max_mib * device.MiB),
                wheels=wheels,
                gguf=args.gguf,
                hf=not args.no_hf,
                jax_cache_from=Path(args.jax_cache_from) if args.jax_cache_from else None,
                jax_cache_max_bytes=int(args.jax_cache_max_mib * device.MiB),
                log=log,
            )
            log(
                f"[pack] {args.pack_dir}: {len(m['artifacts'])} artifacts, "
                f"{sum(len(a['parts']) for a in m['artifacts'])} parts, "
                f"{len(m['wheels'])} wheels, {m['total_bytes'] / device.MiB:.2f} MiB in all"
            )
            if not args.smoke:
                for line in _plan_lines(m, args.pack_dir):
                    log(line)
            return 0
        if args.cmd == "verify":
            m = device.verify_pack(Path(args.pack_dir), [Path(d) for d in args.stage_dir])
            log(
                f"[verify] {args.pack_dir}: every part matches its sha256 "
                f"({m['total_bytes'] / device.MiB:.2f} MiB)"
            )
            return 0
        if args.cmd == "stage":
            done = device.stage_parts(Path(args.pack_dir), Path(args.stage_dir))
            log(f"[stage] {len(done)} part(s) copied to {args.stage_dir}")
            return 0
        if args.cmd == "plan":
            m = device.read_manifest(Path(args.pack_dir))
            for line in _plan_lines(m, args.pack_dir, args.stage_dir, args.budget_s):
                log(line)
            return 0
        if args.cmd == "collect":
            log_path = Path(args.log) if args.log else None
            for p in device.collect(Path(args.bundle), Path(args.out_dir), log_path):
                log(f"[collect] {p}")
            return 0
        out_dir = Path(
            args.out_dir or (Path(args.pack_dir) / "results" if args.smoke else "results/gpu")
        )
        bundle = args.bundle or (
            Path(os.environ["OUT"]) / "device-bench.tgz" if os.environ.get("OUT") else None
        )
        cache_out = args.jax_cache_out or os.environ.get("OUT") or None
        if cache_out is not None and cache_out.lower() == "off":
            cache_out = None
        device.run_device_bench(
            Path(args.pack_dir),
            out_dir,
            budget_s=args.budget_s,
            smoke=args.smoke,
            suites=args.suite,
            bundle_path=bundle,
            shapes=args.shapes or ("tiny" if args.smoke else "papers"),
            stage_dirs=[Path(d) for d in args.stage_dir],
            peers_compile=False if args.no_compile else None,
            methods=args.methods,
            jax_cache=args.jax_cache,
            jax_cache_out=Path(cache_out) if cache_out else None,
            jax_cache_max_bytes=int(args.jax_cache_max_mib * device.MiB),
            matmul_precision=args.matmul_precision,
            log=log,
        )
        return 0
    except (device.PackError, ProjectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
