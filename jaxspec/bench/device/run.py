"""The device run: unpack and check the pack, then time every method in stages.

:func:`run_device_bench` unpacks and checks the pack (:mod:`jaxspec.bench.device.pack`),
loads the vehicles (:mod:`jaxspec.bench.device.vehicles`), then times every registered method
(:mod:`jaxspec.methods`) within a time budget (:class:`Budget`), in stages
(:func:`stage_plan`) so that a budget that runs out loses the least important rows, writing
each suite's results as the suite ends and re-bundling them into one file under ``$OUT``
(:mod:`jaxspec.bench.device.pages`).

The method registry is reached through one adapter (:class:`Registry`), so a change of the
registry's API touches one place.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from jaxspec.bench.device.pack import (
    JAX_CACHE_ARTIFACT,
    JAX_CACHE_MAX_BYTES,
    PROMPTS,
    MiB,
    PackError,
    default_jax_cache,
    export_jax_cache,
    extract_jax_cache,
    install_wheels,
    unpack,
    verify_pack,
)
from jaxspec.bench.device.pages import (
    SUITES,
    bundle,
    device_machine_info,
    machine_header,
    now_iso,
    write_suite,
)
from jaxspec.bench.device.vehicles import (
    DFLASH_ARTIFACT,
    Vehicle,
    dflash_drafter,
    load_vehicles,
)

# The run goes in stages, not suite by suite, so that a budget that runs out loses the least
# important rows: first every method's greedy batch-1 row across the three method suites
# (interleaved family by family), then the peers and the projection, then the other (batch,
# temperature) pairs: batch 8 greedy, then T = 1. Each stage's share of the budget (time a
# stage leaves unused passes on to the next); the later method stages share LATER_SHARE.
# (On the H200 of 2026-11-27, compiling cold, the 13 greedy batch-1 rows that ran took 184 s
# in all, 2.6-42.4 s each; 5 causal ones never ran: hence the first stage's large share.)
STAGE_SHARES = {"first": 0.62, "peers": 0.15, "projection": 0.08}
LATER_SHARE = 0.15
MATMUL_PRECISIONS = ("highest", "high", "default")  # jax_default_matmul_precision


# ----------------------------------------------------------------------------- the registry


class Registry:
    """The one adapter between the device run and :mod:`jaxspec.methods` (its public
    functions ``methods_of``, ``get_method`` and ``run``)."""

    @staticmethod
    def methods(family: str) -> tuple[str, ...]:
        """Names of the registered methods of ``family`` (``causal``, ``dllm``, ``asarm``)."""
        from jaxspec.methods import methods_of

        return tuple(methods_of(family))

    @staticmethod
    def reference(name: str) -> str:
        """The method ``name`` is lossless against (Spiffy: the decoder it accelerates,
        stepwise with the run's one-token-per-step options)."""
        from jaxspec.methods import get_method

        return get_method(name).reference

    @staticmethod
    def lossless(name: str) -> bool:
        """Whether ``name`` is lossless against its reference."""
        from jaxspec.methods import get_method

        return bool(get_method(name).lossless)

    @staticmethod
    def run(
        name: str,
        family: str,
        model,
        params,
        inputs: Sequence,
        options: dict,
        *,
        seed: int = 0,
        eos_ids: Sequence[int] = (),
        pad_id: int = 0,
    ):
        """Run method ``name`` with ``options`` (:meth:`jaxspec.methods.Method.configure`);
        returns the registry's result (``.tokens``, ``.stats``, ``.compile_s``)."""
        from jaxspec.methods import get_method, run

        m = get_method(name, family)
        return run(
            m,
            model,
            params,
            inputs,
            m.configure(options, strict=False),
            seed=seed,
            eos_ids=tuple(eos_ids),
            pad_id=pad_id,
        )


# ----------------------------------------------------------------------------- the budget


@dataclasses.dataclass
class Budget:
    """Wall-clock budget of one device run (seconds from ``start``), shared out by stage
    (:func:`stage_plan`; time a stage leaves unused passes on). A row runs only when the
    time its family's slowest row took fits the stage's time left; otherwise it is skipped
    and says why."""

    total_s: float
    start: float = dataclasses.field(default_factory=time.perf_counter)
    reserve_s: float = 5.0  # kept back for writing results and the bundle

    def left(self) -> float:
        """Seconds left of the whole run, the reserve subtracted."""
        return self.total_s - self.reserve_s - (time.perf_counter() - self.start)

    def share(self, shares: Sequence[float]) -> float:
        """Seconds from now the first of ``shares`` (this stage's, then those of the stages
        still to run) may use: its share of what is left, in proportion."""
        total = sum(shares)
        return max(0.0, self.left() * shares[0] / total) if total > 0 else 0.0


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), wall-clock seconds)``."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# ----------------------------------------------------------------------------- method suites

# Which vehicle each method runs on (default: the family's vehicle of the same name).
METHOD_VEHICLE = {"space": "space"}
REFERENCE_FIRST = {"causal": "ar", "dllm": "stepwise", "asarm": "sequential"}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Sizes of one device run. ``smoke()`` is the CPU smoke mode (tiny budgets)."""

    batches: tuple = (1, 8)
    temperatures: tuple = (0.0, 1.0)
    max_new_tokens: int = 128
    gen_length: int = 256
    block_length: int = 32
    cache: str = "dual"
    diffuspec_k: int = 30
    diffuspec_k_min: int = 20
    sps_draft_layers: int = 8
    seed: int = 0
    # methods besides the reference run at the (batch, temperature) pairs after the first
    # (greedy, batch 1, where every method runs); None: all of them
    later_methods: Optional[int] = None
    # only these methods (their references always run); None: every registered method
    methods: Optional[tuple] = None

    @classmethod
    def smoke(cls) -> "RunSettings":
        """Tiny budgets; every method greedy at batch 1, the reference and one more method
        at the other pairs (the CPU smoke run is compile-bound)."""
        return cls(
            batches=(1, 8),
            temperatures=(0.0, 1.0),
            max_new_tokens=8,
            gen_length=16,
            block_length=8,
            diffuspec_k=6,
            diffuspec_k_min=3,
            sps_draft_layers=1,
            later_methods=1,
        )


def method_options(
    method: str, family: str, vehicles: dict[str, Vehicle], s: RunSettings, temperature: float
) -> dict:
    """The options (:meth:`jaxspec.methods.Method.configure`) of one method on the vehicles."""
    o: dict = {"temperature": float(temperature)}
    if family == "causal":
        o["max_new_tokens"] = s.max_new_tokens
        if method == "sps":
            from jaxspec.bench.peers import truncated_draft

            o["draft_model"] = vehicles["causal"].extra.setdefault(
                "sps_draft", truncated_draft(vehicles["causal"], s.sps_draft_layers)
            )
        if method == "dflash":
            o["drafter_model"] = dflash_drafter(vehicles["causal"])
            o["draft_length"] = o["drafter_model"][0].block_size - 1
        if method in ("diffuspec", "specdiff"):
            d = vehicles["dllm"]
            o.update(
                dllm_drafter=(d.model, d.params),
                draft_length=s.diffuspec_k,
                k_min=s.diffuspec_k_min,
                eos_id=vehicles["causal"].eos_ids[0] if vehicles["causal"].eos_ids else 0,
            )
    elif family == "dllm":
        o.update(gen_length=s.gen_length, block_length=s.block_length, cache=s.cache)
        if method == "fixed-k":
            o["tokens_per_step"] = 2
        if method == "threshold":
            o["threshold"] = 0.9
    return o


def _inputs(family: str, prompts: dict, batch: int) -> list:
    src = prompts[family]
    rows = [src[i % len(src)] for i in range(batch)]
    if family == "asarm":
        return [(r["tokens"], r["masked"]) for r in rows]
    return [list(r) for r in rows]


def _tokens(res) -> list:
    toks = getattr(res, "tokens", None)
    if toks is None:
        toks = getattr(res, "infilled", [])
    return [[int(t) for t in row] for row in toks]


def run_entry(
    method: str,
    family: str,
    vehicle: Vehicle,
    vehicles: dict,
    prompts: dict,
    batch: int,
    temperature: float,
    s: RunSettings,
) -> dict:
    """Compile and time one (method, vehicle, batch, temperature): one untimed call
    (compilation reported as ``compile_s``), then one timed call. Returns the row."""
    opts = method_options(method, family, vehicles, s, temperature)
    inputs = _inputs(family, prompts, batch)

    def call():
        return Registry.run(
            method,
            family,
            vehicle.model,
            vehicle.params,
            inputs,
            opts,
            seed=s.seed,
            eos_ids=vehicle.eos_ids,
            pad_id=vehicle.pad_id,
        )

    first, first_s = timed(call)
    res, wall = timed(call)
    wall -= getattr(res, "compile_s", 0.0) or 0.0
    st = res.stats
    answer = int(sum(int(x) for x in st.new_tokens))
    # a masked-diffusion decoder decodes every position of the generation window, the EOS
    # tail after the answer included: its throughput and MAT count positions
    new = len(inputs) * s.gen_length if family == "dllm" else answer
    nfe = int(sum(int(x) for x in st.target_nfe))
    toks = _tokens(res)
    figs = {}
    if family in ("causal", "dllm"):
        figs = answer_degeneracy(toks, vehicle.eos_ids)
    return {
        "vehicle": vehicle.name,
        "family": family,
        "method": method,
        "batch": batch,
        "temperature": float(temperature),
        "new_tokens": new,
        "answer_tokens": answer,
        **figs,
        "seconds": wall,
        "tokens_per_s": new / wall if wall > 0 else None,
        "nfe": nfe,
        "draft_nfe": int(sum(int(x) for x in st.draft_nfe)),
        "mat": new / nfe if nfe else None,
        "compile_s": float(getattr(first, "compile_s", 0.0) or first_s - wall),
        "lossless": Registry.lossless(method),
        "reference": Registry.reference(method),
        "_tokens": toks,
    }


def answer_degeneracy(rows: Sequence[Sequence[int]], eos_ids: Sequence[int]) -> dict:
    """``{"answer_distinct", "answer_rep4"}``: the mean distinct-token share and repeated
    4-gram rate (:func:`jaxspec.eval.metrics.mean_degeneracy`) of each row's answer, the
    tokens before its first EOS id; ``{}`` when no row has an answer."""
    from jaxspec.eval.metrics import mean_degeneracy

    eos = {int(e) for e in eos_ids}
    answers = []
    for row in rows:
        cut = next((i for i, t in enumerate(row) if int(t) in eos), len(row))
        if cut:
            answers.append([int(t) for t in row[:cut]])
    if not answers:
        return {}
    f = mean_degeneracy(answers, 4)
    return {
        "answer_distinct": f["distinct_token_share"],
        "answer_rep4": f["repeated_ngram_rate"],
    }


def _pairs(s: RunSettings) -> list[tuple]:
    """The run's (temperature, batch) pairs in run order: greedy first, batch 1 first."""
    return [(t, b) for t in s.temperatures for b in s.batches]


def _entries(
    family: str, vehicles: dict, s: RunSettings, pairs: Optional[Sequence[tuple]] = None
) -> list[tuple]:
    """(method, vehicle, batch, temperature) in run order: every method greedy at batch 1,
    then greedy at the larger batches, then sampled; within a group each vehicle's reference
    first (a skipped tail loses the least important rows). ``pairs``: only these
    (temperature, batch) pairs."""
    methods = list(Registry.methods(family))
    ref = REFERENCE_FIRST.get(family)
    if ref in methods:
        methods.remove(ref)
    if s.methods is not None:
        methods = [m for m in methods if m in s.methods]
    out = []
    for n, (t, b) in enumerate(_pairs(s)):
        if pairs is not None and (t, b) not in pairs:
            continue
        for m in methods if n == 0 or s.later_methods is None else methods[: s.later_methods]:
            vname = METHOD_VEHICLE.get(m, family)
            if vname not in vehicles:
                continue
            if ref and (ref, vname, b, t) not in out:
                out.append((ref, vname, b, t))
            out.append((m, vname, b, t))
    return out


def stage_plan(suites: Sequence[str], s: RunSettings) -> list[dict]:
    """The run's stages in order (module constants :data:`STAGE_SHARES`): the method suites'
    first (temperature, batch) pair (greedy batch 1), then ``peers`` and ``projection``, then
    each later pair. Each stage: ``{"label", "kind" ("methods", "peers", "projection"),
    "pair" (methods stages), "families", "share"}``; stages of suites not asked for are
    left out."""
    fams = [_FAMILY_OF_SUITE[x] for x in SUITES if x in suites and x in _FAMILY_OF_SUITE]
    pairs = _pairs(s)
    out = []

    def methods_stage(pair, share):
        t, b = pair
        return {
            "label": f"b{b} T{t:g}",
            "kind": "methods",
            "pair": pair,
            "families": fams,
            "share": share,
        }

    if fams and pairs:
        out.append(methods_stage(pairs[0], STAGE_SHARES["first"]))
    for name in ("peers", "projection"):
        if name in suites:
            out.append({"label": name, "kind": name, "share": STAGE_SHARES[name]})
    if fams:
        out += [methods_stage(pr, LATER_SHARE / max(1, len(pairs) - 1)) for pr in pairs[1:]]
    return out


def _round_robin(queues: dict[str, list]) -> list[tuple]:
    """``(key, item)`` taking one item of each queue in turn (each queue's order kept)."""
    out, qs = [], {k: list(v) for k, v in queues.items()}
    while any(qs.values()):
        for k, q in qs.items():
            if q:
                out.append((k, q.pop(0)))
    return out


def run_methods_stage(
    families: Sequence[str],
    pair: tuple,
    vehicles: dict,
    prompts: dict,
    s: RunSettings,
    deadline_s: float,
    rows: dict[str, list],
    *,
    slowest: Optional[dict[str, float]] = None,
    planned: Optional[dict[str, int]] = None,
    log: Callable[[str], None] = print,
    on_row: Callable[[str], None] = lambda family: None,
) -> None:
    """Every registered method of ``families`` at one (temperature, batch) ``pair``, the
    families taken in turn (one row of each, then the next), within ``deadline_s`` seconds;
    rows are appended to ``rows[family]``. A row is skipped (it says why) when the time left
    is under the time its family's slowest row took (``slowest``, updated). Errors become
    rows (``skipped`` holds the one-line error). ``on_row(family)`` follows each row."""
    t0 = time.perf_counter()
    slowest = {} if slowest is None else slowest
    planned = planned or {}
    queues = {f: _entries(f, vehicles, s, pairs=[pair]) for f in families}
    for family, (m, vname, b, t) in _round_robin(queues):
        fam_rows = rows.setdefault(family, [])
        left = deadline_s - (time.perf_counter() - t0)
        base = {"vehicle": vname, "family": family, "method": m, "batch": b, "temperature": t}
        worst = slowest.get(family, 0.0)
        e0 = time.perf_counter()
        if left < max(worst, 0.5):
            fam_rows.append(
                {
                    **base,
                    "skipped": f"time budget: {left:.0f} s left in this stage, the slowest "
                    f"{family} row took {worst:.0f} s",
                }
            )
        else:
            try:
                fam_rows.append(run_entry(m, family, vehicles[vname], vehicles, prompts, b, t, s))
            except Exception as e:  # noqa: BLE001 - one method's failure must not end the run
                err = " ".join(str(e).split())[:200]
                fam_rows.append({**base, "skipped": f"error: {type(e).__name__}: {err}"})
            slowest[family] = max(worst, time.perf_counter() - e0)
        took = time.perf_counter() - e0
        r = fam_rows[-1]
        n = planned.get(family, len(fam_rows))
        log(
            f"[{family} {len(fam_rows)}/{n}] {vname}/{m} b{b} T{t:g}: "
            + (
                f"{r['tokens_per_s']:.1f} tok/s, MAT {r['mat'] or 0:.2f} ({took:.1f} s)"
                if "seconds" in r
                else r["skipped"]
            )
        )
        _finish_rows(fam_rows)
        on_row(family)


def run_method_suite(
    family: str,
    vehicles: dict,
    prompts: dict,
    s: RunSettings,
    deadline_s: float,
    *,
    log: Callable[[str], None] = print,
    on_row: Callable[[list], None] = lambda rows: None,
) -> list[dict]:
    """Every registered method of ``family`` at each (temperature, batch) pair in turn
    (:func:`run_methods_stage` per pair, the time left passing on), within ``deadline_s``
    seconds. Returns the rows."""
    t0 = time.perf_counter()
    rows: dict[str, list] = {family: []}
    slowest: dict[str, float] = {}
    pairs = _pairs(s)
    planned = {family: len(_entries(family, vehicles, s))}
    for i, pair in enumerate(pairs):
        left = deadline_s - (time.perf_counter() - t0)
        run_methods_stage(
            [family],
            pair,
            vehicles,
            prompts,
            s,
            left / (len(pairs) - i),
            rows,
            slowest=slowest,
            planned=planned,
            log=log,
            on_row=lambda f: on_row(rows[f]),
        )
    return rows[family]


def _finish_rows(rows: list[dict]) -> None:
    """Fill each row's speedup, NFE ratio and identity against its reference's row of the
    same vehicle, batch and temperature (identity: greedy rows of lossless methods)."""
    index = {
        (r["method"], r["vehicle"], r["batch"], r["temperature"]): r for r in rows if "seconds" in r
    }
    for r in rows:
        if "seconds" not in r:
            continue
        ref = index.get((r["reference"], r["vehicle"], r["batch"], r["temperature"]))
        if ref is None:
            continue
        r["speedup_vs_reference"] = ref["seconds"] / r["seconds"] if r["seconds"] > 0 else None
        if r["nfe"] and ref["nfe"] and ref["new_tokens"] and r["new_tokens"]:
            r["nfe_ratio"] = (ref["nfe"] / ref["new_tokens"]) / (r["nfe"] / r["new_tokens"])
        if r["temperature"] == 0.0:
            r["identical_to_reference"] = r["_tokens"] == ref["_tokens"]


def public_rows(rows: list[dict]) -> list[dict]:
    """Rows without their private fields (token lists)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


# ----------------------------------------------------------------------------- suite notes


_FAMILY_OF_SUITE = {"methods-causal": "causal", "methods-dllm": "dllm", "methods-asarm": "asarm"}
_NOTES = {
    "methods": [
        "Every row: one untimed call (compilation, `compile s`), then one timed call of the "
        "same inputs; `seconds` is that call's wall clock less any compile time.",
        "`speedup` = reference seconds / row seconds, the reference being the method's "
        "lossless reference (AR, stepwise, sequential) on the same vehicle, batch and "
        "temperature; `NFE ratio` = the reference's target forwards per token / the row's.",
        "`identical`: greedy rows only, every row's tokens equal the reference's (lossless "
        "methods must; fixed-k and threshold are not lossless). At T = 1 lossless methods "
        "match the reference in distribution, not token for token.",
        "`MAT` = generated tokens / target forwards (prefill counted); masked diffusion "
        "counts every decoded position of the generation window (`new tokens`), the EOS "
        "tail included; `answer` counts the tokens up to the first EOS.",
        "`distinct` and `rep. 4-gram`: mean distinct-token share and repeated 4-gram rate of "
        "the answers (the tokens before each row's first EOS): a looping model agrees with "
        "itself and inflates MAT.",
    ],
}


_SCHEDULE_NOTE = (
    "The run goes in stages: every method's greedy batch-1 row across the method suites first "
    "(the families in turn), then the peers and the projection, then batch 8 greedy, then "
    "T = 1; each stage gets a share of the budget and passes on what it leaves."
)


# ----------------------------------------------------------------------------- the run


def run_device_bench(
    pack_dir: Path,
    out_dir: Path,
    *,
    budget_s: float = 540.0,
    smoke: bool = False,
    suites: Sequence[str] = SUITES,
    bundle_path: Optional[Path] = None,
    shapes: str = "papers",
    stage_dirs: Sequence[Path] = (),
    unpack_dir: Optional[Path] = None,
    wheel_dir: Optional[Path] = None,
    settings: Optional[RunSettings] = None,
    peers_compile: Optional[bool] = None,
    methods: Optional[Sequence[str]] = None,
    jax_cache: Optional[str] = None,
    jax_cache_out: Optional[Path] = None,
    jax_cache_max_bytes: int = JAX_CACHE_MAX_BYTES,
    matmul_precision: str = "highest",
    log: Callable[[str], None] = print,
) -> dict[str, dict]:
    """The device run: verify and unpack the pack, install its wheels, load the vehicles,
    then run the stages of ``suites`` (:func:`stage_plan`) within ``budget_s`` seconds
    (compile included), writing each suite's ``<suite>.json/.md/.png`` under ``out_dir``
    after every row and stage and re-bundling everything into ``bundle_path``. ``methods``
    limits the method suites to those methods (and their references).

    JAX compilation cache: ``jax_cache`` is its folder (default :func:`default_jax_cache`;
    ``"off"``: none; smoke mode: none unless given); a cache the pack carries (``pack
    --jax-cache-from``) is extracted into it first, and with ``jax_cache_out`` the cache goes
    back there after every stage (:func:`export_jax_cache`, at most
    ``jax_cache_max_bytes``).

    ``matmul_precision`` is JAX's ``jax_default_matmul_precision`` for the whole run:
    ``"highest"`` (default) computes float32 products in float32, so the greedy identity
    column compares like with like; ``"default"`` leaves the backend's choice (on NVIDIA GPUs
    TF32 for float32 products, where a verification pass of K + 1 rows and a one-token step
    may round differently and flip a near-tie arg-max: the H200 run of 2026-11-27, at the
    default, had n-gram and batch-8 ASSD rows differ from their references).

    Returns ``{suite: result}``.

    Raises:
      PackError: a missing or corrupt pack (one line), an unknown suite or method, or an
        unknown ``matmul_precision``.
    """
    s, suites, cache_dir, matmul_precision = _setup_run(
        budget_s, smoke, suites, settings, methods, jax_cache, stage_dirs, matmul_precision
    )
    budget = Budget(float(budget_s))
    machine = device_machine_info()
    log(f"[device-bench] {machine_header(machine)}")
    config = {
        "smoke": smoke,
        "budget_s": budget_s,
        "suites": list(suites),
        "matmul_precision": matmul_precision,
    }
    vehicles, prompts = {}, {"task_ids": []}
    if any(x != "projection" for x in suites):  # the projection needs no pack
        vehicles, prompts, loaded = _load_pack(
            Path(pack_dir), unpack_dir, stage_dirs, wheel_dir, cache_dir, s, log
        )
        config.update(loaded)
    config["jax_cache"] = str(cache_dir) if cache_dir else None
    pages = _Pages(Path(out_dir), bundle_path, suites, machine, config)
    stages = stage_plan(suites, s)
    slowest: dict[str, float] = {}
    planned = {
        f: len(_entries(f, vehicles, s))
        for st in stages
        if st["kind"] == "methods"
        for f in st["families"]
    }
    for i, st in enumerate(stages):
        deadline = budget.share([x["share"] for x in stages[i:]])
        pages.state["stages"].append({"stage": st["label"], "deadline_s": round(deadline, 1)})
        log(
            f"[device-bench] stage {i + 1}/{len(stages)} {st['label']}: {deadline:.0f} s of "
            f"{budget.left():.0f} s left"
        )
        if st["kind"] == "methods":
            for f in st["families"]:
                pages.set_status(pages.suite_of[f], "ran")
            run_methods_stage(
                st["families"],
                st["pair"],
                vehicles,
                prompts,
                s,
                deadline,
                pages.rows,
                slowest=slowest,
                planned=planned,
                log=log,
                on_row=pages.emit_family,
            )
        else:
            _run_other_stage(
                st["kind"], pages, vehicles, prompts, s, deadline, shapes, peers_compile, log
            )
        _export_cache(cache_dir, jax_cache_out, jax_cache_max_bytes, machine, log)
    pages.finish()
    log(
        f"[device-bench] done in {time.perf_counter() - budget.start:.0f} s; results in "
        f"{out_dir}" + (f", bundle {bundle_path}" if bundle_path else "")
    )
    return pages.results


def _setup_run(budget_s, smoke, suites, settings, methods, jax_cache, stage_dirs, precision):
    """Check :func:`run_device_bench`'s arguments and set up JAX (matmul precision, the
    smoke mode's optimisation level, the persistent compilation cache).

    Returns ``(settings, suites in run order, cache folder or None, precision in force)``.
    Raises :class:`PackError` on a bad argument."""
    from jaxspec.core.compile_cache import enable_persistent_cache

    bad = [x for x in suites if x not in SUITES]
    if bad:
        raise PackError(f"unknown suite {bad[0]!r}; available: {', '.join(SUITES)}")
    if budget_s <= 0:
        raise PackError(f"--budget-s must be > 0, got {budget_s}")
    if precision not in MATMUL_PRECISIONS:
        raise PackError(
            f"matmul precision {precision!r}: expected one of {', '.join(MATMUL_PRECISIONS)}"
        )
    import jax

    if smoke:  # the CPU computes float32 products in float32 already; leave the process be
        precision = "default"
        # tiny models: compile time is all there is (as in the test suite)
        jax.config.update("jax_disable_most_optimizations", True)
    if precision != "default":
        jax.config.update("jax_default_matmul_precision", precision)
    s = settings or (RunSettings.smoke() if smoke else RunSettings())
    if methods is not None:
        known = {m for fam in ("causal", "dllm", "asarm") for m in Registry.methods(fam)}
        bad = [m for m in methods if m not in known]
        if bad:
            raise PackError(f"unknown method {bad[0]!r}; available: {', '.join(sorted(known))}")
        s = dataclasses.replace(s, methods=tuple(methods))
    cache_dir = None
    if jax_cache is None and not smoke:
        jax_cache = str(default_jax_cache(stage_dirs))
    if jax_cache is not None and str(jax_cache).lower() != "off":
        cache_dir = enable_persistent_cache(jax_cache)
        cache_dir = Path(cache_dir) if cache_dir else None
    return s, [x for x in SUITES if x in suites], cache_dir, precision


def _load_pack(pack_dir: Path, unpack_dir, stage_dirs, wheel_dir, cache_dir, s, log):
    """Verify and unpack the pack (and a carried JAX cache), install its wheels, load the
    prompts and the vehicles. Returns ``(vehicles, prompts, config entries)``."""
    unpack_dir = Path(unpack_dir or pack_dir / "unpacked")
    (manifest, t_verify) = timed(lambda: verify_pack(pack_dir, stage_dirs))
    log(
        f"[device-bench] pack verified: {len(manifest['artifacts'])} artifacts, "
        f"{manifest['total_bytes'] / MiB:.1f} MiB, sha256 ok ({t_verify:.1f} s)"
        + (
            f"; left out (not carried): {', '.join(manifest['left_out'])}"
            if manifest.get("left_out")
            else ""
        )
    )
    arts = unpack(pack_dir, unpack_dir, stage_dirs, manifest)
    if JAX_CACHE_ARTIFACT in arts and cache_dir is not None:
        meta = next(a for a in manifest["artifacts"] if a["name"] == JAX_CACHE_ARTIFACT)
        n = extract_jax_cache(arts[JAX_CACHE_ARTIFACT], cache_dir)
        was = meta.get("meta") or {}
        log(
            f"[device-bench] JAX cache: {n} file(s) carried in to {cache_dir} (written "
            f"by jax {was.get('jax', '?')} on {was.get('accelerator', '?')}; hits need "
            f"the same jax and device)"
        )
    from jaxspec.bench.peers import FASTDLLM_ARTIFACT, unpack_fastdllm

    if FASTDLLM_ARTIFACT in arts:
        where = unpack_fastdllm(arts[FASTDLLM_ARTIFACT], unpack_dir / "Fast-dLLM")
        log(f"[device-bench] official Fast-dLLM code unpacked to {where}")
    shutil.copyfile(pack_dir / manifest["prompts"]["file"], unpack_dir / PROMPTS)
    if manifest.get("wheels"):
        names = install_wheels(pack_dir, Path(wheel_dir or "/tmp/jaxspec-site"), manifest)
        log(f"[device-bench] installed {', '.join(names)}")
    prompts = json.loads((unpack_dir / PROMPTS).read_text())
    vehicles, t_load = timed(lambda: load_vehicles(manifest, unpack_dir, log=log))
    log(f"[device-bench] vehicles {', '.join(vehicles)} loaded ({t_load:.1f} s)")
    if DFLASH_ARTIFACT in arts and "causal" in vehicles:
        vehicles["causal"].extra["dflash_file"] = arts[DFLASH_ARTIFACT]
        log(f"[device-bench] trained DFlash drafter: {arts[DFLASH_ARTIFACT]}")
    loaded = {
        "batches": list(s.batches),
        "temperatures": list(s.temperatures),
        "max_new_tokens": s.max_new_tokens,
        "gen_length": s.gen_length,
        "block_length": s.block_length,
        "cache": s.cache,
        "prompts": len(prompts["task_ids"]),
        "vehicles": {
            k: v.get("preset") or v.get("factory") or v.get("kind")
            for k, v in manifest["vehicles"].items()
            if isinstance(v, dict)
        },
    }
    return vehicles, prompts, loaded


class _Pages:
    """The run's result pages: every suite's status and stages (``state``), the method rows
    per family (``rows``), and writing ``<suite>.json/.md/.png`` (and the bundle) as they
    change."""

    def __init__(self, out_dir: Path, bundle_path, suites, machine: dict, config: dict):
        self.out_dir, self.bundle_path = out_dir, bundle_path
        self.machine, self.config = machine, config
        self.results: dict[str, dict] = {}
        self.state = {
            "suites": [{"suite": n, "status": "not reached"} for n in suites],
            "stages": [],
        }
        self.rows: dict[str, list] = {}  # family -> rows with their tokens
        self.suite_of = {f: n for n, f in _FAMILY_OF_SUITE.items()}
        self.dates: dict[str, str] = {}

    def set_status(self, name: str, status: str) -> None:
        for e in self.state["suites"]:
            if e["suite"] == name:
                e["status"] = status

    def base(self, name: str) -> dict:
        self.dates.setdefault(name, now_iso())
        return {
            "suite": name,
            "date": self.dates[name],
            "machine": self.machine,
            "config": self.config,
        }

    def emit(self, name: str, result: dict, plot: bool) -> None:
        self.results[name] = {**result, "run": json.loads(json.dumps(self.state))}
        write_suite(self.results[name], self.out_dir, plot=plot)
        if self.bundle_path:
            bundle(self.out_dir, self.bundle_path, list(self.results))

    def emit_family(self, family: str, plot: bool = False) -> None:
        name = self.suite_of[family]
        notes = list(_NOTES["methods"]) + [_SCHEDULE_NOTE]
        rows = public_rows(self.rows.get(family, []))
        self.emit(name, {**self.base(name), "notes": notes, "rows": rows}, plot)

    def finish(self) -> None:
        """The final pages, with every stage's share and the charts."""
        for f in self.rows:
            self.emit_family(f, plot=True)
        for name in [n for n in ("peers", "projection") if n in self.results]:
            self.emit(name, {k: v for k, v in self.results[name].items() if k != "run"}, True)
        if self.bundle_path:
            bundle(self.out_dir, self.bundle_path, list(self.results))


def _run_other_stage(name, pages: _Pages, vehicles, prompts, s, deadline, shapes, compile_, log):
    """The ``peers`` or ``projection`` stage; a failure becomes its page's note."""
    from jaxspec.bench import peers, projection

    if deadline < 1.0:
        pages.set_status(name, "skipped: no time left in the budget")
        pages.emit(
            name, {**pages.base(name), "rows": [], "notes": ["skipped: no time left"]}, False
        )
        return
    pages.set_status(name, "ran")
    try:
        if name == "peers":
            res = peers.run_peers_suite(vehicles, prompts, s, deadline, compile=compile_, log=log)
        else:
            measured = [r for fam_rows in pages.rows.values() for r in fam_rows]
            res = projection.run_projection_suite(
                shapes, measured=public_rows(measured), deadline_s=deadline, log=log
            )
    except Exception as e:  # noqa: BLE001 - a suite's failure must not end the run
        err = peers.one_line(e)
        log(f"[device-bench] suite {name} failed: {err}")
        pages.set_status(name, f"failed: {err}")
        res = {"rows": [], "notes": [f"the suite failed: {err}"], "failed": err}
    pages.emit(name, {**pages.base(name), **res}, True)


def _export_cache(cache_dir, out, max_bytes, machine, log) -> None:
    """Write the JAX cache back under ``out`` (optional: a failure is one log line)."""
    from jaxspec.bench import peers

    if cache_dir is None or out is None:
        return
    try:
        meta = {
            "jax": machine.get("jax"),
            "accelerator": machine.get("accelerator") or machine.get("cpu"),
        }
        info, t = timed(
            lambda: export_jax_cache(cache_dir, Path(out), max_bytes=max_bytes, meta=meta)
        )
        log(
            f"[device-bench] JAX cache: {info['entries']} file(s), "
            f"{info['bytes'] / MiB:.1f} MiB in {len(info['parts'])} part(s) under "
            f"{out} ({info['left_out']} left out by the bound; {t:.1f} s)"
        )
    except Exception as e:  # noqa: BLE001 - the cache is optional, the results are not
        log(f"[device-bench] JAX cache not exported: {peers.one_line(e)}")
