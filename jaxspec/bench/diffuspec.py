"""Benchmark suite ``diffuspec``: a diffusion LM drafts for a causal target (DiffuSpec,
arXiv:2510.02358, Sec. 5), all greedy, batch 1, in one process (wall-clock ratios
are comparable within one run only).

1. **Prompt sets** (:data:`jaxspec.bench.prompts.PROMPT_SETS`: HumanEval completion and chat,
   MT-Bench first turns, "Summarize:" news): per set, interleaved prompt by prompt
   (:func:`jaxspec.bench.ar_suite.run_ar_suite`), ``jaxspec/ar`` (baseline and reference),
   ``jaxspec/ngram``, ``jaxspec/specdiff`` (argmax block, fixed ``k_max``: the paper's
   SpecDiff row) and ``jaxspec/diffuspec`` (CPS + ADL); per drafter cache other than
   ``none`` in ``drafter_caches`` also ``specdiff+CACHE`` and ``diffuspec+CACHE`` (``prefix``:
   :class:`~jaxspec.causal.diffuspec.DrafterCache`; same vocabulary only).
2. **Table 2 ablations** on the first set: CPS on/off x ADL on/off (:data:`ABLATIONS`).
3. **Fixed-k sweep** (Table 5) on the first set: CPS on, ADL off, ``k`` in :data:`FIXED_K`.
4. **Refinement steps** (Fig. 5a) on the first set: DiffuSpec with ``S`` in :data:`REFINE_STEPS`.

Definitions (the paper's tables disagree on MAT; this suite uses one rule throughout):

* **MAT** = generated tokens / target forwards, the prefill counted as one forward and the
  bonus or correction token of every step counted (AR has MAT 1).
* **mean accepted length** = accepted draft tokens / decode steps (the bonus not counted).
* **draft NFE / token** = drafter forwards (``S`` per proposal) / generated tokens.
* **answer figures** (:mod:`jaxspec.bench.answers`; shown first): the causal verifier stops at
  the first EOS, so every target and drafter forward is spent on the answer:
  ``answer_tokens_per_nfe`` (answer tokens, EOS included, per target forward),
  ``answer_tokens_per_draft_nfe``, ``answer_tokens_per_s`` and ``answer_speedup`` (median
  per-prompt ratio of AR's seconds to the row's, on the same answers); ``answer_flag`` marks
  a row whose answers are mostly EOS (short) or loop.

Prompt sets: :data:`jaxspec.bench.prompts.PROMPT_SETS` and ``long`` (HumanEval raw
completions alternating with held-out stdlib function bodies,
:func:`jaxspec.bench.answers.prompt_set`).

Draft-model speculative sampling (SPS) and transformers' assisted generation run in the ``ar``
suite on a causal pair (``--suite ar --model qwen2.5-coder-1.5b-instruct --draft-model
qwen2.5-coder-0.5b-instruct --systems jaxspec/ar jaxspec/sps transformers/ar
transformers/assisted``): their target is another model than this suite's.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from jaxspec.bench import answers as ans
from jaxspec.bench.ar_suite import free_programs, run_ar_suite
from jaxspec.bench.machine import machine_info
from jaxspec.bench.prompts import PROMPT_SETS, suite_prompts
from jaxspec.bench.records import BenchError
from jaxspec.bench.report import MAT_DEFINITION, plot_k_sweep, report_header, save_figure
from jaxspec.bench.systems import JaxspecSystem
from models.llama.layout import resolve_layer_loop

# Table 2: label -> (cps, adl)
ABLATIONS = {
    "diffuspec": (True, True),
    "cps-only": (True, False),
    "adl-only": (False, True),
    "specdiff": (False, False),
}
FIXED_K = (5, 10, 20, 30)
REFINE_STEPS = (1, 2, 4)


def diffuspec_drafter_options(
    dllm_drafter, drafter_tok, target_tok=None, *, proxy: bool = True
) -> dict:
    """The config options (:class:`jaxspec.methods.causal.DiffuSpecConfig`) of a DiffuSpec drafter:
    ``dllm_drafter``, ``eos_id`` (the drafter tokenizer's first EOS, which the CPS lattice
    keeps), the Eq. 7 causal ``proxy``, a hashed 3-gram
    (:class:`~jaxspec.causal.diffuspec.NgramProxy`) over the drafter's ids fitted on the
    tokenized stdlib training split of ``dream-smollm2-135m`` (its held-out modules and the
    benchmark prompts stay out; tokens cached by :func:`jaxspec.training.data.stdlib_tokens`),
    and, when ``target_tok`` has another vocabulary than ``drafter_tok``, the
    ``vocab_adapter`` pair that translates drafts through text
    (:mod:`jaxspec.causal.hetero`). ``proxy=False`` leaves the proxy out (CPS then ranks by
    drafter log-probabilities alone)."""
    from jaxspec.causal.diffuspec import NgramProxy
    from jaxspec.training.config import load_config
    from jaxspec.training.data import stdlib_tokens

    eos = drafter_tok.eos_token_ids[0] if drafter_tok.eos_token_ids else 0
    out = {"dllm_drafter": dllm_drafter, "eos_id": eos, "proxy": None}
    if target_tok is not None and not target_tok.same_vocabulary(drafter_tok):
        out["vocab_adapter"] = (target_tok, drafter_tok)
    if proxy:
        cfg = Path(__file__).resolve().parents[2] / "configs/train/dream-smollm2-135m-v1.yaml"
        train, _, _ = stdlib_tokens(drafter_tok, load_config(cfg).data.holdout, sep_id=eos)
        out["proxy"] = NgramProxy.fit(train, drafter_tok.vocab_size)
    return out


def _systems(target, drafter: dict, common: dict, variants: dict[str, dict]) -> list:
    """``jaxspec/ar`` plus one DiffuSpec system per ``label -> option overrides``."""
    model, params = target
    out = [JaxspecSystem("ar", model, params, **common)]
    for label, opts in variants.items():
        method = "specdiff" if label.startswith("specdiff") else "diffuspec"
        out.append(
            JaxspecSystem(method, model, params, **common, options={**drafter, **opts}, label=label)
        )
    return out


class _Recorder:
    """A system that keeps its last full-budget output per prompt (the ``ar`` suite's rows
    keep no tokens), for the answer accounting."""

    def __init__(self, inner):
        self.inner, self.outs = inner, {}
        self.system, self.method, self.name = inner.system, inner.method, inner.name

    def run(self, ids, max_new_tokens=None):
        out = self.inner.run(ids, max_new_tokens)
        if max_new_tokens is None:
            self.outs[tuple(ids)] = out
        return out


def _run(systems, prompts, *, progress, log, eos_ids=(), flag_rule=None, **fields) -> list[dict]:
    rec = [_Recorder(s) for s in systems]
    res = run_ar_suite(rec, prompts, model_name="target", progress=progress, log=log)
    runs = {
        s.name: [
            ans.causal_answer(
                o.tokens, eos_ids, nfe=o.target_nfe, seconds=o.seconds, draft_nfe=o.draft_nfe
            )
            for o in (s.outs[tuple(p.ids)] for p in prompts)
        ]
        for s in rec
    }
    base = runs[rec[0].name]  # jaxspec/ar: every list starts with it
    for r in res["rows"]:
        a = runs[f"{r['system']}/{r['method']}"]
        r.update(fields)
        r.update(ans.answer_figures(a, draft=True, rule=flag_rule))
        r["answer_speedup"] = ans.answer_speedups(a, base)["answer_speedup"]
    return res["rows"]


def suite_prompt_sets(tok, sets: Sequence[str], limit: int) -> dict:
    """Token ids per prompt set: ``long`` from :func:`jaxspec.bench.answers.prompt_set`, the
    others from :func:`jaxspec.bench.prompts.suite_prompts` (order kept)."""
    other = [s for s in sets if s != "long"]
    got = suite_prompts(tok, other, limit) if other else {}
    return {s: (ans.prompt_set(tok, "long", limit) if s == "long" else got[s]) for s in sets}


def _check_drafter(drafter: dict, k_min: int, k_max: int) -> None:
    """Raise :class:`BenchError` without a diffusion drafter or with a bad ``k_min``/``k_max``."""
    if drafter.get("dllm_drafter") is None:
        raise BenchError("suite diffuspec needs a diffusion drafter (--draft-model NAME)")
    if not 1 <= k_min <= k_max:
        raise BenchError(f"need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")


def _drafter_caches(drafter: dict, drafter_caches: Sequence[str], log) -> list[str]:
    """The drafter caches other than ``none`` that the prompt-set rows add (none, with a log
    line, for a drafter of another vocabulary); an unknown cache raises :class:`BenchError`."""
    unknown = set(drafter_caches) - {"none", "prefix"}
    if unknown:
        raise BenchError(f"unknown drafter cache(s) {sorted(unknown)}: use none / prefix")
    caches = [c for c in drafter_caches if c != "none"]
    if caches and drafter.get("vocab_adapter") is not None:
        log("[diffuspec] drafter caches need the target's vocabulary: skipped for this pair")
        caches = []
    return caches


def _check_sets(sets: Sequence[str]) -> None:
    """Raise :class:`BenchError` naming the first unknown prompt set."""
    unknown_sets = [s for s in sets if s not in PROMPT_SETS and s != "long"]
    if unknown_sets:
        raise BenchError(
            f"unknown prompt set {unknown_sets[0]!r}; available: {', '.join(PROMPT_SETS)}, long"
        )


def _result_head(model_name, drafter_name, config: dict, flag_rule) -> dict[str, Any]:
    """The result's leading keys: suite, date, machine, model, drafter, config, flag rule."""
    return {
        "suite": "diffuspec",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "model": model_name,
        "drafter": drafter_name,
        "config": config,
        "answer_flag_rule": dict(flag_rule or {}),
    }


def _set_systems(target, drafter: dict, common: dict, caches: Sequence[str]) -> list:
    """A prompt set's systems: ``ar``, ``ngram`` (draft length 8), ``specdiff``, ``diffuspec``
    and per cache ``specdiff+CACHE`` / ``diffuspec+CACHE``."""
    model, params = target
    systems = [
        JaxspecSystem("ar", model, params, **common),
        JaxspecSystem("ngram", model, params, **{**common, "draft_length": 8}),
    ]
    variants = {"specdiff": {}, "diffuspec": {}}
    for c in caches:
        variants.update(
            {f"specdiff+{c}": {"drafter_cache": c}, f"diffuspec+{c}": {"drafter_cache": c}}
        )
    return systems + _systems(target, drafter, common, variants)[1:]


def _ablation_rows(target, drafter: dict, common: dict, first, first_name: str, kw) -> list:
    """The Table 2 grid (:data:`ABLATIONS`) on the first prompt set."""
    return _run(
        _systems(
            target,
            drafter,
            common,
            {label: {"cps": c, "adl": a} for label, (c, a) in ABLATIONS.items()},
        ),
        first,
        prompt_set=first_name,
        **kw,
    )


def _fixed_k_rows(target, drafter, common, fixed_k, first, first_name: str, kw) -> list:
    """The Table 5 sweep on the first prompt set: one run per ``k`` (the static draft buffer is
    ``k`` wide), its non-AR rows tagged with ``k``."""
    out = []
    for k in fixed_k:
        rows = _run(
            _systems(
                target, drafter, {**common, "draft_length": int(k)}, {f"fixed-k{k}": {"adl": False}}
            ),
            first,
            prompt_set=first_name,
            **kw,
        )
        out += [dict(r, k=int(k)) for r in rows if r["method"] != "ar"]
    return out


def _refine_rows(target, drafter, common, refine_steps, first, first_name: str, kw) -> list:
    """The ``S`` sweep (Fig. 5a) on the first prompt set, every row tagged with ``S`` (AR: 0)."""
    return [
        dict(r, S=0 if r["method"] == "ar" else int(r["method"][1:]))
        for r in _run(
            _systems(
                target,
                drafter,
                common,
                {f"S{s}": {"refine_steps": int(s)} for s in refine_steps},
            ),
            first,
            prompt_set=first_name,
            **kw,
        )
    ]


def run_diffuspec_suite(
    target,
    drafter: dict,
    tok,
    *,
    sets: Sequence[str] = PROMPT_SETS,
    limit: int = 5,
    k_max: int = 30,
    k_min: int = 20,
    fixed_k: Sequence[int] = FIXED_K,
    refine_steps: Sequence[int] = REFINE_STEPS,
    ablations: bool = True,
    drafter_caches: Sequence[str] = ("none",),
    max_new_tokens: int = 128,
    model_name: str = "smollm2-135m-instruct",
    drafter_name: str = "dream-smollm2-135m",
    config: Optional[dict] = None,
    progress: bool = True,
    flag_rule: Optional[dict] = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict:
    """The whole suite (module docstring).

    Args:
      target: ``(CausalLM, params)`` of the causal verifier.
      drafter: the config options of the drafter (:func:`diffuspec_drafter_options`):
        ``dllm_drafter`` ``(DiffusionLM, params)`` with the target's vocabulary, ``proxy``
        (:class:`~jaxspec.causal.diffuspec.NgramProxy` or None) and ``eos_id``.
      tok: the target's tokenizer (chat template, EOS).
      sets, limit: prompt sets (:data:`~jaxspec.bench.prompts.PROMPT_SETS` and ``long``) and
        prompts per set.
      k_max, k_min: DiffuSpec's draft-length range (paper: 30 / 20).
      fixed_k: the Table 5 sweep (empty: skipped); refine_steps: the ``S`` sweep (empty:
        skipped); ablations: run the Table 2 grid.
      flag_rule: overrides of :data:`jaxspec.eval.quality.ANSWER_FLAG_RULE`.
      drafter_caches: drafter caches of the prompt-set rows (``"none"``, ``"prefix"``); a
        cache other than ``none`` adds ``specdiff+CACHE`` / ``diffuspec+CACHE`` rows (skipped,
        with a log line, for a drafter of another vocabulary).

    Returns:
      ``{"suite": "diffuspec", "date", "machine", "model", "drafter", "config", "sets",
      "ablations", "fixed_k", "refine_steps"}``; every row carries MAT, mean accepted length,
      target / draft NFE per token, speedup vs AR, identity and degeneracy figures.

    Raises:
      BenchError: no drafter, ``k_min > k_max``, ``limit < 1`` or an unknown prompt set.
    """
    _check_drafter(drafter, k_min, k_max)
    eos = tuple(tok.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    common = dict(max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=pad, draft_length=k_max)
    drafter = {**drafter, "k_min": k_min}
    caches = _drafter_caches(drafter, drafter_caches, log)
    _check_sets(sets)
    prompt_sets = suite_prompt_sets(tok, sets, limit)
    first_name, first = next(iter(prompt_sets.items()))
    kw = dict(progress=progress, log=log, eos_ids=eos, flag_rule=flag_rule)
    cfg = dict(
        config or {},
        limit=limit,
        k_max=k_max,
        k_min=k_min,
        max_new_tokens=max_new_tokens,
        sets=list(sets),
        fixed_k=list(fixed_k),
        refine_steps=list(refine_steps),
        ablations=ablations,
        temperature=0.0,
        drafter_caches=["none"] + caches,
        ablation_set=first_name,
        layer_loop=resolve_layer_loop(),
    )
    result = _result_head(model_name, drafter_name, cfg, flag_rule)
    result["sets"] = {}
    for name, prompts in prompt_sets.items():
        log(f"[diffuspec] prompt set {name}: {len(prompts)} prompts")
        systems = _set_systems(target, drafter, common, caches)
        result["sets"][name] = _run(systems, prompts, prompt_set=name, **kw)
        del systems
        free_programs(lambda m: log(f"[diffuspec] {m}"))
    phase = (target, drafter, common)
    result["ablations"] = _ablation_rows(*phase, first, first_name, kw) if ablations else []
    result["fixed_k"] = _fixed_k_rows(*phase, fixed_k, first, first_name, kw)
    result["refine_steps"] = (
        _refine_rows(*phase, refine_steps, first, first_name, kw) if refine_steps else []
    )
    return result


_COLUMNS = [
    ("prompt_set", "set", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("answer_length", "answer len", "{:.1f}"),
    ("answer_tokens_per_s", "answer tok/s", "{:.1f}"),
    ("answer_speedup", "answer speedup vs AR", "{:.2f}x"),
    ("answer_tokens_per_nfe", "answer tok/NFE", "{:.2f}"),
    ("answer_tokens_per_draft_nfe", "answer tok/draft NFE", "{:.2f}"),
    ans.FLAG_COLUMN,
    ("new_tokens", "tokens", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("speedup_vs_baseline", "speedup vs AR", "{:.2f}x"),
    ("mat", "MAT", "{:.2f}"),
    ("mean_accepted_length", "accepted/step", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("nfe_per_token", "target NFE/token", "{:.3f}"),
    ("draft_nfe_per_token", "draft NFE/token", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
]


def markdown_report(result: dict) -> str:
    """The suite's markdown page: machine, the four tables, definitions and paper anchors."""
    c = result["config"]
    out = report_header(
        f"Benchmark suite `diffuspec` ({result['drafter']} -> {result['model']})", result
    )
    rows = [r for rs in result["sets"].values() for r in rs]
    every = rows + [
        r for k in ("ablations", "fixed_k", "refine_steps") for r in result.get(k) or []
    ]
    flag = ans.flag_line(every, ("prompt_set", "method"), result.get("answer_flag_rule"))
    out += [flag, ""] if flag else []
    out += ["## Prompt sets (batch 1, greedy)", "", ans.markdown_table(rows, _COLUMNS), ""]
    for key, title in (
        ("ablations", "Table 2 ablations (CPS x ADL)"),
        ("fixed_k", "Fixed draft length, CPS on, ADL off (Table 5)"),
        ("refine_steps", "Drafter refinement steps S (Fig. 5a)"),
    ):
        if result.get(key):
            out += [
                f"## {title}, set `{c.get('ablation_set')}`",
                "",
                ans.markdown_table(result[key], _COLUMNS),
                "",
            ]
    out += [
        "How to read this:",
        "",
        "- Answer columns (first): the verifier stops at the first EOS, so all its forwards "
        "are answer forwards; `answer len` = mean tokens through the EOS, `answer tok/NFE` "
        "per target forward, `answer tok/draft NFE` per drafter forward, `answer tok/s` the "
        "median over prompts, `answer speedup vs AR` the median per-prompt ratio of AR's "
        "seconds to the row's (the same answers: the method is lossless). Sets: `long` = "
        "HumanEval raw completions alternating with held-out stdlib function bodies; the "
        "others as named.",
        f"- {MAT_DEFINITION} `accepted/step` = accepted draft tokens per decode step "
        "(bonus not counted). `draft NFE/token`: drafter forwards (S per proposal) per "
        "generated token.",
        "- Paper anchors (Dream-7B -> Qwen2.5-32B, A100): DiffuSpec MAT 6.99 / 3.08x, SPS "
        "6.18 / 1.67x. Here drafter and target are both 135M: a drafter forward over the "
        "whole context costs more than a target step, so MAT, not wall clock, is the "
        "figure to compare.",
        "- `identical`: tokens equal to AR greedy decoding of the target (lossless); "
        "`distinct` / `rep. 4-gram` are the degeneracy figures of the outputs.",
        "",
    ]
    return "\n".join(out) + "\n"


def plot(result: dict, out: Path) -> Path:
    """MAT and speedup per method and set (left), MAT against fixed k (right)."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    sets = list(result["sets"])
    methods = [r["method"] for r in result["sets"][sets[0]]] if sets else []
    width = 0.8 / max(len(methods), 1)
    for j, meth in enumerate(methods):
        mats = [next((r["mat"] for r in result["sets"][s] if r["method"] == meth), 0) for s in sets]
        a.bar([i + j * width for i in range(len(sets))], mats, width, label=meth)
    a.set_xticks([i + 0.4 - width / 2 for i in range(len(sets))], sets, fontsize=8)
    a.set_ylabel("MAT (tokens / target forward)")
    a.legend(fontsize=8)
    a.set_title("prompt sets")
    fk = result.get("fixed_k") or []
    if fk:
        plot_k_sweep(b, fk, "fixed draft length k (CPS on, ADL off)", "fixed-k sweep")
    return save_figure(
        fig,
        out,
        f"DiffuSpec: {result['drafter']} -> {result['model']} ({result['machine'].get('cpu')})",
    )


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """JSON, markdown and chart (:func:`jaxspec.bench.report.write_results` with this suite's
    report and plot)."""
    from jaxspec.bench.report import write_results as write

    return write(
        result,
        out,
        report=markdown_report,
        plot=plot,
        caption="MAT per prompt set and the fixed-k sweep",
    )
