"""Benchmark suite ``dflash``: trained DFlash drafters (:mod:`jaxspec.causal.dflash`; DFlash,
arXiv 2602.06036) beside AR, n-gram, SPS, SpecDiff and DiffuSpec on one causal target, greedy,
batch 1.

Two parts, in one process (wall-clock ratios are comparable within one run only):

1. **Prompt sets** (:data:`PROMPT_SETS`: HumanEval completion, MT-Bench first turns, news
   summaries): per set, :func:`jaxspec.bench.ar_suite.run_ar_suite` interleaves ``jaxspec/ar``
   (baseline and reference), ``jaxspec/ngram``, ``jaxspec/sps`` (when a draft model is given),
   ``jaxspec/specdiff+prefix`` and ``jaxspec/diffuspec+prefix`` (when a diffusion drafter is
   given; their default draft lengths) and one ``jaxspec/dflash-b<B>`` row per drafter: the
   **block sweep** is the drafters given (each trained for its own block size ``B``, e.g. 4, 8
   and 16; a drafter runs only at the block it was trained for), and with ``verify_lengths``
   each drafter also at shorter draft lengths ``k`` (``dflash-b<B>-k<k>``: its whole block is
   forwarded, the first ``k`` drafts verified). A DFlash row adds ``block_size``,
   ``draft_length`` ``k`` and ``accept_by_position``: for draft ``i = 1 .. k`` of the block, the
   share of the steps that reached draft ``i`` (every draft before it accepted) in which it was
   accepted, from the decoder's acceptance histogram; and ``accept_hist``, the steps by drafts
   accepted (0 .. k).
2. **Drafter cost per forward** (:func:`drafter_cost`): per drafter and draft length ``k``
   (``B - 1`` and the ``verify_lengths``), the median seconds of one jitted drafter forward
   (``propose``: the block's ``B`` rows through the drafter and the LM head on ``k`` rows) and
   of one jitted target verification pass over ``k + 1`` tokens (with the feature layers),
   after the prompt pass of the first prompt, against one one-token target pass of AR
   decoding; each in the layer loop and weight layouts of its decode plan, as the decode loop
   runs it. The report also gives each DFlash row's measured step cost in AR steps (MAT /
   speedup), which adds the loop's acceptance, commit and drafter update.

**MAT** = generated tokens / target forward passes (the prompt pass counts as one): AR has 1.
Every row carries the degeneracy figures of its outputs (distinct share, repeated 4-grams).
"""

from __future__ import annotations

import datetime
import itertools
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxspec.bench.ar_suite import free_programs, run_ar_suite
from jaxspec.bench.machine import machine_info
from jaxspec.bench.prompts import suite_prompts
from jaxspec.bench.records import BenchError, BenchPrompt, _num
from jaxspec.bench.report import MAT_DEFINITION, markdown_table, report_header, save_figure
from jaxspec.bench.systems import JaxspecSystem

__all__ = [
    "PROMPT_SETS",
    "accept_by_position",
    "drafter_cost",
    "run_dflash_suite",
    "markdown_report",
    "write_results",
]

PROMPT_SETS = ("humaneval", "mt-bench", "news")


def accept_by_position(hist: Sequence[int]) -> list[Optional[float]]:
    """Per-position acceptance in the block from an acceptance histogram.

    Args:
      hist: ``(k + 2,)`` decode steps by tokens produced (:attr:`DecodeStats.accept_hist`
        summed over rows): entry ``n + 1`` counts the steps that accepted ``n`` drafts; entry
        0 (no token) is ignored.

    Returns:
      ``k`` values: for draft ``i = 1 .. k``, (steps accepting ``>= i`` drafts) / (steps
      accepting ``>= i - 1``), None where no step reached draft ``i``.
    """
    acc = np.asarray(hist, np.int64)[1:]  # acc[n]: steps with n drafts accepted
    k = len(acc) - 1
    reach = np.cumsum(acc[::-1])[::-1]  # reach[n]: steps with >= n accepted
    return [_num(reach[i] / reach[i - 1], 4) if reach[i - 1] else None for i in range(1, k + 1)]


def _checked_drafters(drafters: Sequence, target_config, names=None) -> list:
    """The drafters as ``(spec, own, name, tag)`` in block-size order (a stable sort: drafters
    of one block size keep their order), each checked against the target. ``tag`` is the
    row-label suffix ``@<name>`` where several drafters share a block size, else ``""``.

    Raises:
      BenchError: no drafter, names not one per drafter or repeated, two of one block size
        without names, one built for another target."""
    if not drafters:
        raise BenchError("suite dflash needs at least one trained drafter (--dflash-drafter FILE)")
    if names is not None and (len(names) != len(drafters) or len(set(names)) != len(names)):
        raise BenchError(
            f"drafter names must be one distinct name per drafter, got {list(names)} for "
            f"{len(drafters)} drafters"
        )
    named = zip(drafters, names if names is not None else [None] * len(drafters))
    out = sorted(((d[0], d[1], n) for d, n in named), key=lambda d: d[0].block_size)
    blocks = [d[0].block_size for d in out]
    shared = {b for b in blocks if blocks.count(b) > 1}
    if shared and names is None:
        raise BenchError(
            f"drafters of one block size need names to tell their rows apart, got block sizes "
            f"{blocks}"
        )
    for spec, *_ in out:
        try:
            spec.check_target(target_config)
        except ValueError as e:
            raise BenchError(str(e)) from None
    return [(s, o, n, f"@{n}" if s.block_size in shared else "") for s, o, n in out]


def _peer_systems(model, params, draft_model, draft_length: int, dllm_drafter, common: dict):
    """The rows beside DFlash: AR (baseline, reference), n-gram, SPS (with a draft model),
    SpecDiff and DiffuSpec (with a diffusion drafter)."""
    systems = [
        JaxspecSystem("ar", model, params, **common),
        JaxspecSystem("ngram", model, params, **common, draft_length=draft_length),
    ]
    if draft_model is not None:
        systems.append(
            JaxspecSystem(
                "sps",
                model,
                params,
                **common,
                draft_length=draft_length,
                options={"draft_model": draft_model},
            )
        )
    return systems + _diffusion_drafter_systems(model, params, dllm_drafter, common)


def _add_dflash_figures(rows: list[dict], rec: dict, prompt_set: str, n_prompts: int) -> None:
    """Tag every row with its prompt set; a DFlash row also gets its block size, draft length,
    drafter name, ``draft_vocab`` (the ids its drafter's LM head runs on: the target's
    vocabulary size for the full head), ``ngram_first``, ``drafter_forwards_per_step`` (below 1
    where the n-gram lookup drafted every row), acceptance histogram and acceptance by position
    over the timed runs (the last ``n_prompts`` decodes its recording entry saw)."""
    for r in rows:
        r["prompt_set"] = prompt_set
        if r["method"] in rec:
            hist = np.sum(rec[r["method"]].hists[-n_prompts:], axis=0)
            shape = rec[r["method"]].shape
            r["block_size"], r["draft_length"], r["drafter"], r["draft_vocab"] = shape[:4]
            r["ngram_first"] = shape[4]
            nfe, steps = np.sum(rec[r["method"]].forwards[-n_prompts:], axis=0)
            r["drafter_forwards_per_step"] = round(float(nfe) / max(int(steps), 1), 3)
            r["accept_hist"] = [int(x) for x in hist[1:]]
            r["accept_by_position"] = accept_by_position(hist)


def _dflash_systems(
    model,
    params,
    drafters,
    verify_lengths: Sequence[int],
    common: dict,
    draft_vocab=None,
    ngram_first: bool = False,
):
    """``(system, block size, draft length, drafter name, LM head rows, ngram first)`` per
    DFlash row: each drafter
    (:func:`_checked_drafters`) at its whole block (``dflash-b<B>``, ``B - 1`` drafts), then at
    each shorter draft length of ``verify_lengths`` (``dflash-b<B>-k<k>``), shortest first;
    with ``draft_vocab`` each of those rows again with the drafter's LM head on the draft
    vocabulary (``-v<V_d>``); with ``ngram_first`` each again behind the n-gram lookup
    (``+ngram``, :class:`~jaxspec.core.drafters.LookupFirst`); ``@<name>`` last where several
    drafters share the block size."""
    out = []
    vocabs = [None] if draft_vocab is None else [None, draft_vocab]
    lookups = [False, True] if ngram_first else [False]
    for spec, own, name, tag in drafters:
        B = spec.block_size
        for k in [k for k in sorted(set(verify_lengths)) if k < B - 1] + [B - 1]:
            for vocab, lookup in itertools.product(vocabs, lookups):
                s = JaxspecSystem(
                    "dflash",
                    model,
                    params,
                    **common,
                    draft_length=k,
                    options={
                        "drafter_model": (spec, own),
                        "draft_vocab": vocab,
                        "ngram_first": lookup,
                    },
                    label=f"dflash-b{B}"
                    + ("" if k == B - 1 else f"-k{k}")
                    + ("" if vocab is None else f"-v{len(vocab)}")
                    + ("+ngram" if lookup else "")
                    + tag,
                )
                rows = spec.vocab_size if vocab is None else len(vocab)
                out.append((s, B, k, name, rows, lookup))
    return out


def _diffusion_drafter_systems(model, params, dllm_drafter: Optional[dict], common: dict):
    """The ``specdiff+prefix`` and ``diffuspec+prefix`` rows (a diffusion LM drafting for the
    causal target; :mod:`jaxspec.causal.diffuspec`), or none without ``dllm_drafter``."""
    if dllm_drafter is None:
        return []
    return [
        JaxspecSystem(
            method,
            model,
            params,
            **common,
            options={**dllm_drafter, "drafter_cache": "prefix"},
            label=f"{method}+prefix",
        )
        for method in ("specdiff", "diffuspec")
    ]


class _Recording:
    """A registry entry that keeps the acceptance histogram of every decode it runs."""

    def __init__(self, entry):
        self.entry, self.hists, self.forwards = entry, [], []

    def configure(self, *a, **kw):
        return self.entry.configure(*a, **kw)

    def run(self, *a, **kw):
        res = self.entry.run(*a, **kw)
        self.hists.append(np.asarray(res.stats.accept_hist).sum(axis=0))
        self.forwards.append((int(np.sum(res.stats.draft_nfe)), int(np.sum(res.stats.steps))))
        return res


def _median_s(fn, reps: int) -> float:
    import jax

    jax.block_until_ready(fn())  # compile and warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _planned_start(model, params, drafter, own_params, buf, pad, max_new: int):
    """The decode plan's model and weights for ``drafter`` (None: AR) and the state after the
    prompt pass, as :func:`jaxspec.causal.decode.generate` builds them (its cache size
    ``P + max_new + k + 1`` plus the drafter's query slots): ``(cfg, verify params, step
    params, drafter params, state, cache slots S)``."""
    import jax

    from jaxspec.causal import decode as D
    from jaxspec.core.sampling import SamplingConfig
    from models.llama import layout

    k = 0 if drafter is None else drafter.draft_length
    S = buf.shape[1] + max_new + k + 1 + (0 if drafter is None else drafter.query_slots)
    plan = D.decode_plan(model, params, drafter, own_params, cache_slots=S)
    cfg = D.LoopConfig(
        model=layout.plan_model(model, plan),
        max_new=max_new,
        sampling=SamplingConfig(),
        drafter=drafter,
        eos_ids=(),
    )
    verify_params, step_params = layout.plan_trees(params, plan)
    dparams = layout.plan_draft_tree(own_params, plan)
    prefill = jax.jit(D.prefill, static_argnums=0)
    st = prefill(cfg, verify_params, dparams, buf, pad, jax.random.PRNGKey(0))
    return cfg, verify_params, step_params, dparams, st, S


def _pass_program(cfg, S: int, hidden_layers: tuple):
    """A jitted target pass ``(params, feed (1, T) int32, first_slot (1,) int32, pad (1,)
    int32, cache) -> (logits (1, T, V), cache[, hidden states of hidden_layers])``, the decode
    loop's :func:`jaxspec.causal.decode.target_pass`. Every output is returned, so that XLA
    keeps the cache writes and the feature layers; the cache is not donated, so a call also
    copies it once, which the loop (updating it in place) does not."""
    import jax

    from jaxspec.causal import decode as D

    @jax.jit
    def target(p, feed, first_slot, pad, cache):
        out = D.target_pass(cfg, p, feed, first_slot, pad, cache, S, hidden_layers=hidden_layers)
        return (out[0], *out[2:])

    return target


def drafter_cost(
    model,
    params,
    spec,
    own,
    ids: Sequence[int],
    *,
    draft_lengths: Sequence[int] = (),
    max_new: int = 128,
    bucket: int = 64,
    draft_vocab=None,
    reps: int = 21,
) -> list[dict]:
    """Seconds of one drafter forward against one target verification pass, per draft length
    ``k`` (the block's ``B - 1`` and each of ``draft_lengths`` below it), and of one AR
    one-token target pass, after the prompt pass over ``ids`` with room for ``max_new`` new
    tokens (module docstring, part 2).

    A step at draft length ``k`` is one drafter forward (the whole block through the drafter,
    the LM head on ``k`` rows) and one ``k + 1``-token verification pass with the feature
    layers: ``step_over_ar`` = their sum over the one-token pass of AR decoding (no feature
    layers). Each program runs as :func:`jaxspec.causal.decode.generate` runs it: the prompt
    left-padded to ``bucket`` (generate's default), the model, the target's weights and the
    drafter's in the layer loop and layouts of the decode plan
    (:func:`jaxspec.causal.decode.decode_plan`) for that ``k``, or for AR, and a cache of the
    loop's size. The programs are separate calls, so each also pays a dispatch and a cache
    copy the loop does not (:func:`_pass_program`); the ratio leaves out the loop's
    acceptance, commit and the drafter's ``absorb_features`` update, and the AR loop's
    sampling. The decode loop's whole step cost is its MAT / speedup
    (:func:`markdown_report`).

    With ``draft_vocab`` (token ids) the drafter's LM head runs on those ids only
    (:func:`jaxspec.causal.dflash.drafter_params`).

    Returns:
      one dict per ``k``, ascending: ``{"block_size", "draft_length", "drafter_params",
      "draft_vocab", "drafter_s", "verify_s", "one_token_s", "drafter_over_verify",
      "step_over_ar"}`` (``draft_vocab``: the ids the drafter's LM head runs on; seconds:
      medians of ``reps`` timed calls after a warm-up)."""
    import jax
    import jax.numpy as jnp

    from jaxspec.causal import decode as D
    from jaxspec.causal.dflash import DFlashDrafter, drafter_params
    from jaxspec.core.drafters import DraftContext

    B = spec.block_size
    own_params = drafter_params(own, params, draft_vocab)
    buf, pad = D.left_pad([list(ids)], bucket, 0)
    buf, pad = jnp.asarray(buf), jnp.asarray(pad)
    cfg, _, ar_params, _, st, S = _planned_start(model, params, None, (), buf, pad, max_new)
    first = st.length - 1  # the last emitted token's slot, where the next pass starts
    last = jnp.take_along_axis(st.buffer, first[:, None], axis=1)
    one_token = _pass_program(cfg, S, ())
    one_s = _median_s(lambda: one_token(ar_params, last, first, pad, st.cache), reps)
    rows = []
    for k in sorted({B - 1, *(k for k in draft_lengths if 1 <= k < B - 1)}):
        drafter = DFlashDrafter(spec, verify_length=k)
        cfg, verify_params, _, dparams, st, S = _planned_start(
            model, params, drafter, own_params, buf, pad, max_new
        )
        ctx = DraftContext(buffer=st.buffer, length=st.length, pad=pad, active=~st.done)
        verify = _pass_program(cfg, S, spec.layer_ids)
        propose = jax.jit(
            lambda dp, ds, c, d=drafter: d.propose(dp, ds, c, jax.random.PRNGKey(1), False)[0]
        )
        feed = jnp.concatenate([last, propose(dparams, st.drafter_state, ctx).tokens], axis=1)
        d_s = _median_s(lambda: propose(dparams, st.drafter_state, ctx), reps)
        v_s = _median_s(lambda: verify(verify_params, feed, first, pad, st.cache), reps)
        rows.append(
            {
                "block_size": B,
                "draft_length": k,
                "drafter_params": int(sum(x.size for x in jax.tree.leaves(own))),
                "draft_vocab": spec.vocab_size if draft_vocab is None else len(draft_vocab),
                "drafter_s": _num(d_s, 6),
                "verify_s": _num(v_s, 6),
                "one_token_s": _num(one_s, 6),
                "drafter_over_verify": _num(d_s / v_s, 4),
                "step_over_ar": _num((d_s + v_s) / one_s, 3),
            }
        )
    return rows


def _cost_rows(model, params, drafters, prompt, verify_lengths, max_new, draft_vocab, reps):
    """:func:`drafter_cost`'s rows of every drafter (with its name), with the full LM head and
    with ``draft_vocab``."""
    return [
        {"drafter": name, **row}
        for spec, own, name, _ in drafters
        for vocab in ([None] if draft_vocab is None else [None, draft_vocab])
        for row in drafter_cost(
            model,
            params,
            spec,
            own,
            prompt,
            draft_lengths=verify_lengths,
            max_new=max_new,
            draft_vocab=vocab,
            reps=reps,
        )
    ]


def run_dflash_suite(
    target,
    drafters: Sequence,
    tok,
    *,
    sets: Sequence[str] = PROMPT_SETS,
    limit: int = 5,
    max_new_tokens: int = 128,
    draft_model=None,
    draft_length: int = 8,
    dllm_drafter: Optional[dict] = None,
    verify_lengths: Sequence[int] = (),
    draft_vocab=None,
    ngram_first: bool = False,
    model_name: str = "smollm2-135m-instruct",
    prompt_sets: Optional[dict[str, list[BenchPrompt]]] = None,
    config: Optional[dict] = None,
    drafter_names: Optional[Sequence[str]] = None,
    cost_reps: int = 21,
    progress: bool = True,
    log: Callable[[str], None] = lambda m: None,
) -> dict:
    """The whole suite (module docstring).

    Args:
      target: ``(CausalLM, params)``; drafters: ``(DFlashSpec, own weights)`` pairs
        (:func:`jaxspec.causal.dflash.load_drafter`), one row each, in block-size order.
      tok: the tokenizer (prompt sets, EOS, padding); sets, limit: prompt sets and prompts
        per set, or ``prompt_sets`` already encoded (tests).
      draft_model: ``(CausalLM, params)`` of the SPS draft model (None: no SPS row).
      draft_length: k of the n-gram and SPS rows.
      dllm_drafter: the diffusion-drafter options of the DiffuSpec and SpecDiff rows
        (:func:`jaxspec.bench.diffuspec.diffuspec_drafter_options`), or None (no such rows).
        Both rows use the drafter's prefix cache and their own default draft lengths.
      verify_lengths: shorter draft lengths ``k < B - 1`` to run each drafter at besides its
        whole block (row ``dflash-b<B>-k<k>``: the drafter forwards its trained block and the
        verifier checks the first ``k`` drafts, :attr:`~jaxspec.causal.dflash.DFlashDrafter.
        verify_length`); lengths ``>= B - 1`` are skipped for that drafter.
      draft_vocab: token ids (:func:`jaxspec.causal.dflash.load_draft_vocab`): every DFlash
        row and cost row again with the drafter's LM head on those ids only (``-v<V_d>``).
      ngram_first: every DFlash row again behind the context n-gram lookup (``+ngram``:
        rows whose context has a suffix match draft the copy, the drafter the others;
        :class:`~jaxspec.core.drafters.LookupFirst`, not in the DFlash paper).
      drafter_names: one distinct name per drafter (e.g. its file's folder), recorded in its
        rows and cost rows (``drafter``); needed when two drafters share a block size, whose
        rows then end in ``@<name>`` (two drafters compared in one run, on one machine state).

    Returns:
      ``{"suite": "dflash", "date", "machine", "model", "config", "sets", "drafter_cost"}``.

    Raises:
      BenchError: no drafter, two drafters of one block size without names, names that are
        not one distinct name per drafter, or a drafter built for another target
        (:meth:`DFlashSpec.check_target`).
    """
    model, params = target
    drafters = _checked_drafters(drafters, model.config, drafter_names)
    blocks = [d[0].block_size for d in drafters]
    eos = tuple(tok.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    common = dict(max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=pad)
    if prompt_sets is None:
        prompt_sets = suite_prompts(tok, sets, limit)
    out_sets: dict[str, Any] = {}
    for name, prompts in prompt_sets.items():
        log(f"[dflash] prompt set {name}: {len(prompts)} prompts")
        systems = _peer_systems(model, params, draft_model, draft_length, dllm_drafter, common)
        rec = {}
        for s, *shape in _dflash_systems(
            model, params, drafters, verify_lengths, common, draft_vocab, ngram_first
        ):
            s.entry = rec[s.method] = _Recording(s.entry)
            rec[s.method].shape = tuple(shape)
            systems.append(s)
        res = run_ar_suite(systems, prompts, model_name=model_name, progress=progress, log=log)
        _add_dflash_figures(res["rows"], rec, name, len(prompts))
        out_sets[name] = {"rows": res["rows"], "per_prompt": res["per_prompt"]}
        del systems, rec, res
        free_programs(lambda m: log(f"[dflash] {m}"))
    first = next(iter(prompt_sets.values()))[0].ids
    costs = _cost_rows(
        model, params, drafters, first, verify_lengths, max_new_tokens, draft_vocab, cost_reps
    )
    return {
        "suite": "dflash",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "model": model_name,
        "config": dict(
            config or {},
            sets=list(prompt_sets),
            limit=limit,
            max_new_tokens=max_new_tokens,
            draft_length=draft_length,
            blocks=blocks,
            drafter_names=[d[2] for d in drafters],
            verify_lengths=sorted(set(verify_lengths)),
            draft_vocab=None if draft_vocab is None else len(draft_vocab),
            ngram_first=bool(ngram_first),
            diffusion_drafter_rows=dllm_drafter is not None,
            temperature=0.0,
        ),
        "sets": out_sets,
        "drafter_cost": costs,
    }


_SET_COLUMNS = [
    ("prompt_set", "set", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("new_tokens", "tokens", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("speedup_vs_baseline", "speedup vs AR", "{:.2f}x"),
    ("draft_length", "k", "{}"),
    ("mat", "MAT", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("drafter_forwards_per_step", "drafter forwards / step", "{:.2f}"),
    ("identical_to_reference", "identical", "{}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
]
_COST_COLUMNS = [
    ("drafter", "drafter", "{}"),
    ("block_size", "block", "{}"),
    ("draft_length", "k", "{}"),
    ("drafter_params", "drafter params", "{:,}"),
    ("draft_vocab", "LM head rows", "{:,}"),
    ("drafter_s", "drafter forward (s)", "{:.4f}"),
    ("verify_s", "verification pass (s)", "{:.4f}"),
    ("one_token_s", "one-token pass (s)", "{:.4f}"),
    ("drafter_over_verify", "drafter / verify", "{:.3f}"),
    ("step_over_ar", "step / one-token pass", "{:.2f}"),
]


def markdown_report(result: dict) -> str:
    """The suite's markdown page: machine, the prompt-set table, per-position acceptance,
    drafter cost, how to read."""
    out = report_header(f"Benchmark suite `dflash` ({result['model']})", result)
    rows = [r for s in result["sets"].values() for r in s["rows"]]
    out += ["## Prompt sets (batch 1, greedy)", "", markdown_table({"rows": rows}, _SET_COLUMNS)]
    out += ["", "## Acceptance by position in the block", ""]
    for r in rows:
        if r.get("accept_by_position") is not None:
            cells = ", ".join("-" if a is None else f"{a:.2f}" for a in r["accept_by_position"])
            line = f"- {r['prompt_set']} / {r['method']}: {cells}"
            if r.get("speedup_vs_baseline"):
                line += f" (a step costs {r['mat'] / r['speedup_vs_baseline']:.2f} AR steps)"
            out.append(line)
    out += [
        "",
        "## Drafter cost per forward",
        "",
        markdown_table({"rows": result["drafter_cost"]}, _COST_COLUMNS),
        "",
        "How to read this:",
        "",
        f"- {MAT_DEFINITION}",
        "- `dflash-b<B>`: a drafter trained for block size B drafts B - 1 tokens in one "
        "forward; acceptance by position i: of the steps whose drafts 1..i-1 were all "
        "accepted, the share that also accepted draft i.",
        "- A step's cost in AR steps, measured in the decode loop, is MAT / speedup: the MAT "
        "the step needs to break even with AR.",
        "- Drafter cost: per draft length k, one drafter forward (the LM head on k rows) and "
        "one target verification pass of k + 1 tokens (with the feature layers), against one "
        "one-token target pass of AR decoding; jitted programs in the decode plans' layer "
        "loop and weight layouts, median seconds. `step / one-token pass` leaves out the "
        "loop's acceptance, commit and the drafter's feature update, which the measured step "
        "cost above includes, and adds what separate calls pay (a dispatch and a cache copy "
        "per program), which the loop does not.",
        "- `-v<V_d>` rows: the drafter's LM head runs on a draft vocabulary of V_d token ids "
        "only (`LM head rows` in the cost table); drafts never leave it, and the decode stays "
        "exact.",
        "- `+ngram` rows (n-gram lookup first; not in the DFlash paper): a step whose last "
        "2-3 tokens occurred before in the context drafts the tokens that followed them, "
        "other steps draft with the drafter; `drafter forwards / step` is the share of steps "
        "that ran the drafter. Exact either way.",
        "- `identical` compares with AR greedy decoding of the same target (lossless); "
        "`distinct` / `rep. 4-gram` are degeneracy figures of the outputs.",
        "",
    ]
    return "\n".join(out) + "\n"


def plot(result: dict, out: Path) -> Path:
    """MAT against draft length per prompt set and drafter (left; with several drafters of one
    block size or with ``+ngram`` rows, grouped bars of MAT per set beside the n-gram row
    instead), acceptance by position (right; full-head rows only, the ``-v<V_d>`` rows' MAT is
    in the table). Legends sit below the panels."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5.5))
    dflash = {n: [r for r in s["rows"] if "block_size" in r] for n, s in result["sets"].items()}
    config = result.get("config", {})
    names = config.get("drafter_names") or []
    blocks = config.get("blocks") or []
    if len(set(blocks)) < len(blocks) or config.get("ngram_first"):
        # drafters compared at one block size, or with the n-gram lookup first: MAT bars per
        # set, beside the n-gram peer
        peer = [r for r in result["sets"][next(iter(dflash))]["rows"] if r["method"] == "ngram"]
        methods = [r["method"] for r in peer]
        methods += list(dict.fromkeys(r["method"] for rs in dflash.values() for r in rs))
        width = 0.8 / max(len(methods), 1)
        for j, m in enumerate(methods):
            mats = [
                next((r["mat"] for r in s["rows"] if r["method"] == m), 0.0)
                for s in result["sets"].values()
            ]
            a.bar([i + j * width for i in range(len(dflash))], mats, width, label=m)
        a.set_xticks([i + 0.4 - width / 2 for i in range(len(dflash))], list(dflash))
        a.set_ylabel("MAT")
        a.set_title(f"MAT per prompt set ({', '.join(names)})", fontsize=8)
    else:
        for name, rs in dflash.items():
            for d in dict.fromkeys(r.get("drafter") for r in rs):  # one line per drafter
                mine = [r for r in rs if r.get("drafter") == d and not r.get("ngram_first")]
                label = name if d is None else f"{name} {d}"
                a.plot(
                    [r["draft_length"] for r in mine], [r["mat"] for r in mine], "o-", label=label
                )
        a.set_xlabel("draft length (drafts verified per step)")
        a.set_ylabel("MAT")
        a.set_title("block and draft-length sweep")
    full_head = max((r.get("draft_vocab") or 0 for rs in dflash.values() for r in rs), default=0)
    for name, rs in dflash.items():
        for r in rs:
            if (r.get("draft_vocab") or full_head) < full_head:  # a draft-vocabulary row
                continue
            pos = [i + 1 for i, x in enumerate(r["accept_by_position"]) if x is not None]
            vals = [x for x in r["accept_by_position"] if x is not None]
            b.plot(pos, vals, ".-", label=f"{name} {r['method']}")
    b.set_xlabel("draft position in the block")
    b.set_ylabel("acceptance given the drafts before")
    b.set_title("acceptance by position")
    for ax in (a, b):
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return save_figure(fig, out, f"DFlash on {result['model']} ({result['machine'].get('cpu')})")


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """JSON, markdown and chart (:func:`jaxspec.bench.report.write_results`)."""
    from jaxspec.bench.report import write_results as write

    return write(
        result, out, report=markdown_report, plot=plot, caption="block and draft-length sweep"
    )
