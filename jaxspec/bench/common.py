"""Side-by-side benchmark machinery (docs/results.md).

The ``ar`` suite compares greedy batch-1 decoding of one causal model by several *systems*:

* ``jaxspec/ar``: our jitted autoregressive decoder (:func:`jaxspec.causal.decode.generate`), the
  suite's **baseline** and the **reference** every other system's tokens are compared with;
* ``jaxspec/ngram``: our speculative decoder with :class:`jaxspec.core.drafters.NgramDrafter`
  (prompt-lookup suffix matching; steps without a match run as plain AR steps);
* ``jaxspec/ngram-bigram``: the same drafter with the ASSD Eq. 23 bigram fallback, so every
  step verifies k drafts;
* ``transformers/ar``: ``model.generate(do_sample=False)`` of a PyTorch model loaded from the
  same weight file;
* ``transformers/prompt-lookup``: the same with ``prompt_lookup_num_tokens=K``;
* on request, ``jaxspec/ar-int8`` and ``jaxspec/ngram-int8``: AR and n-gram decoding of the
  model with weight-only int8 projection matrices (:func:`models.quant.quantize_params` of the
  loaded weights). They change the model, so their rows report the drift from ``jaxspec/ar``
  (``identical_share``, ``first_divergence``) and, for losslessness, identity with AR of the
  same int8 model (``identical_to_quant_reference``; ``jaxspec/ngram-int8`` always brings
  ``jaxspec/ar-int8`` along as that reference).

Protocol (:func:`run_ar_suite`): every system first runs one warm-up generation (jaxspec's
compilation happens there and is reported as ``compile_s``); then, for each prompt in turn,
every system decodes it (the order rotates from prompt to prompt), so slow drift or noise of
the machine hits all systems alike. Per-prompt throughput is ``new tokens / wall-clock
seconds`` of that call; rows quote the median over prompts, and ``speedup_vs_baseline`` is
the median over prompts of ``baseline seconds / system seconds``. With the bandwidth ceiling
(``num_params``), each AR system also decodes every prompt with a one-token budget right after
its full run: the time to the first token (``ttft_s``), and ``decode_tokens_per_s``, the rate of
the decode steps alone, which is what the ceiling bounds.

Everything here works on already-loaded models and already-encoded prompts, so tests can run
it on tiny random models; :mod:`scripts.benchmark` adds presets, HumanEval and the CLI.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import gc
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxspec.core.batching import cut_after_eos
from jaxspec.core.runtime import clear_compiled, compiled_snapshot, use_compiled
from jaxspec.eval.metrics import mean_degeneracy
from jaxspec.methods import get_method, methods_of

SUITES = ("ar", "dllm", "ssd", "spiffy", "assd", "space", "diffuspec")
# every causal method of the registry is a jaxspec system; ngram-bigram is the n-gram drafter
# with the Eq. 23 fallback
SYSTEMS = tuple(f"jaxspec/{m}" for m in methods_of("causal")) + (
    "jaxspec/ngram-bigram",
    "jaxspec/ar-scan",
    "jaxspec/ngram-scan",
    "jaxspec/ar-unrolled",
    "jaxspec/ngram-unrolled",
    "jaxspec/ngram-om",
    "jaxspec/ngram-stored",
    "jaxspec/ngram-gate",
    "jaxspec/ar-int8",
    "jaxspec/ngram-int8",
    "transformers/ar",
    "transformers/prompt-lookup",
    "transformers/assisted",
)
BASELINE = "jaxspec/ar"
# systems that need more than the target model run on request only: jaxspec/sps and
# transformers/assisted a draft model (--draft-model), jaxspec/diffuspec / specdiff a diffusion
# drafter, jaxspec/space a SAR-SFT target, jaxspec/dflash a trained DFlash drafter
NEEDS_MORE = (
    "jaxspec/sps",
    "jaxspec/dflash",
    "jaxspec/space",
    "jaxspec/diffuspec",
    "jaxspec/specdiff",
    "transformers/assisted",
)
# jaxspec/<method>-scan / -unrolled: the same decoder under the lax.scan layer loop on stacked
# weights / the unrolled per-layer loop (a DecodePlan, models.llama.layout) instead of the
# device's default ("auto": unrolled on CPU and GPU when the per-layer copy fits the memory),
# to show what each buys; on request
# jaxspec/<method>-om / -stored: verification passes on output-major / stored weights
# (a DecodePlan, models.llama.layout) instead of the timed choice ("auto"); on request only
# jaxspec/ngram-gate: the n-gram drafter behind its cost gate (option gate "auto")
# jaxspec/<method>-int8: weight-only int8 (models.quant); on request only
QUANT_REFERENCE = "jaxspec/ar-int8"
_VERIFY_SUFFIXES = {"-om": "output-major", "-stored": "stored"}
_LOOP_SUFFIXES = {"-scan": "scan", "-unrolled": "unrolled"}
ON_REQUEST = NEEDS_MORE + (
    "jaxspec/ar-scan",
    "jaxspec/ngram-scan",
    "jaxspec/ar-unrolled",
    "jaxspec/ngram-unrolled",
    "jaxspec/ngram-om",
    "jaxspec/ngram-stored",
    "jaxspec/ngram-gate",
    "jaxspec/ar-int8",
    "jaxspec/ngram-int8",
)
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if s not in ON_REQUEST)


class BenchError(ValueError):
    """Bad benchmark request: unknown suite or system, bad budget, a peer that cannot load."""


@dataclasses.dataclass
class BenchPrompt:
    """One benchmark prompt: an identifier (e.g. HumanEval ``task_id``) and its token ids."""

    task_id: str
    ids: list[int]


@dataclasses.dataclass
class RunOutput:
    """One system's decode of one prompt.

    Attributes:
      tokens: generated ids, cut at the budget and after the first EOS (kept).
      seconds: wall-clock seconds of the call, compilation excluded.
      target_nfe: target-model forward passes (the prompt pass counts as one).
      proposed: draft tokens offered for verification (0 for autoregressive systems).
      accepted: draft tokens accepted.
      compile_s: seconds spent compiling during this call (jaxspec only).
      draft_nfe: draft-model forward passes (0 for model-free drafters; jaxspec only).
      steps: decode-loop iterations after the prefill (jaxspec only; 0 = not recorded).
      settings: the decoder's per-machine choices (verification layout, gate cost;
        :attr:`models.llama.layout.DecodePlan.settings`), jaxspec speculative systems only.
    """

    tokens: list[int]
    seconds: float
    target_nfe: int
    proposed: int = 0
    accepted: int = 0
    compile_s: float = 0.0
    draft_nfe: int = 0
    steps: int = 0
    settings: dict = dataclasses.field(default_factory=dict)


# prompt sets of the space and diffuspec suites (suite_prompts)
PROMPT_SETS = ("humaneval", "humaneval-chat", "mt-bench", "news")


def suite_prompts(
    tok, sets: Sequence[str], limit: int, start: int = 0
) -> dict[str, list[BenchPrompt]]:
    """Token ids of the first ``limit`` prompts of each set (:data:`PROMPT_SETS`).

    Raises:
      BenchError: an unknown set name or ``limit < 1``.
    """
    from jaxspec.eval.datasets import (
        chat_prompt,
        humaneval_problems,
        humaneval_prompt,
        lee_documents,
        mtbench_questions,
        summarize_prompt,
    )

    if limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    out = {}
    for name in sets:
        sl = slice(start, start + limit)
        if name in ("humaneval", "humaneval-chat"):
            texts = [
                (p["task_id"], humaneval_prompt(p, tok, name == "humaneval-chat"))
                for p in humaneval_problems()[sl]
            ]
        elif name == "mt-bench":
            texts = [
                (f"mt-bench/{q['question_id']}", chat_prompt(q["turns"][0], tok))
                for q in mtbench_questions()[sl]
            ]
        elif name == "news":
            texts = [
                (f"lee/{i}", summarize_prompt(d, tok))
                for i, d in list(enumerate(lee_documents()))[sl]
            ]
        else:
            raise BenchError(f"unknown prompt set {name!r}; available: {', '.join(PROMPT_SETS)}")
        out[name] = [BenchPrompt(t, tok.encode(x)) for t, x in texts]
    return out


def cut_output(tokens: Sequence[int], eos_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """``tokens`` cut to ``max_new_tokens`` and after the first EOS (which is kept): the rule
    :func:`jaxspec.causal.decode.generate` applies, used for every system's output."""
    return cut_after_eos([[int(t) for t in tokens]], eos_ids, budget=[max_new_tokens])[0]


def parse_systems(spec: Optional[Sequence[str]]) -> list[str]:
    """Validate a ``--systems`` list (items may also be comma-separated).

    Returns the systems in the canonical order of :data:`SYSTEMS`, with the baseline
    ``jaxspec/ar`` always included (it is the reference for identity and speedup), and
    ``jaxspec/ar-int8`` whenever ``jaxspec/ngram-int8`` is (its same-quantization reference);
    no ``spec`` means :data:`DEFAULT_SYSTEMS`.

    Raises:
      BenchError: an unknown system name.
    """
    if not spec:
        return list(DEFAULT_SYSTEMS)
    names = [s.strip() for item in spec for s in item.split(",") if s.strip()]
    bad = [n for n in names if n not in SYSTEMS]
    if bad:
        raise BenchError(f"unknown system {bad[0]!r}; available: {', '.join(SYSTEMS)}")
    chosen = set(names) | {BASELINE}
    if any(n.endswith("-int8") for n in chosen):
        chosen.add(QUANT_REFERENCE)
    return [s for s in SYSTEMS if s in chosen]


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> Optional[int]:
    """The first position (0-based, in generated tokens) where ``tokens`` and ``reference``
    differ, the shorter length when one is a proper prefix of the other (e.g. an earlier EOS),
    or None when they are identical."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


_QUANTIZED: list = []  # [(float params, int8 params)]: one quantization shared by all systems


def quantized_params(params):
    """``params`` with weight-only int8 matrices (:func:`models.quant.quantize_params`),
    computed once per parameter tree and shared by every ``-int8`` system.

    Raises:
      BenchError: the tree is already quantized (``--quant int8``) or not a Llama / Qwen2 body.
    """
    from models.quant import QuantError, is_quantized, quantize_params

    for src, out in _QUANTIZED:
        if src is params:
            return out
    if is_quantized(params):
        raise BenchError(
            "the jaxspec/*-int8 systems quantize the float weights themselves and "
            "compare with the float jaxspec/ar; drop --quant int8"
        )
    try:
        out = quantize_params(params, "int8")
    except QuantError as e:
        raise BenchError(str(e)) from None
    _QUANTIZED[:] = [(params, out)]
    return out


# ----------------------------------------------------------------------------- systems


class JaxspecSystem:
    """``jaxspec/<method>`` for any causal method of the registry (:mod:`jaxspec.methods`;
    ``ngram-bigram`` is ``ngram`` with the bigram fallback; ``<method>-scan`` / ``-unrolled``
    runs the method on a :class:`models.llama.layout.DecodePlan` with the ``"scan"`` /
    ``"unrolled"`` layer loop; ``<method>-om`` / ``-stored`` on one with the
    ``"output-major"`` / ``"stored"`` verification layout (:meth:`run_planned`);
    ``ngram-gate`` with the n-gram cost gate (``gate="auto"``); ``<method>-int8`` runs it on
    the weight-only int8 model, :func:`quantized_params`), greedy, batch 1. ``options``
    adds method options (:meth:`jaxspec.methods.Method.configure`) (``draft_model`` for sps,
    ``mask_groups`` for space); ``label`` renames the row's method (e.g. ``space-k3``)."""

    def __init__(
        self,
        method: str,
        model,
        params,
        *,
        max_new_tokens: int,
        eos_ids: Sequence[int],
        pad_id: int,
        draft_length: int = 8,
        max_ngram: int = 3,
        min_ngram: int = 2,
        options: Optional[dict] = None,
        label: Optional[str] = None,
    ):
        self.quant = "int8" if method.endswith("-int8") else None
        base = method.removesuffix("-int8")
        self.loop = next((v for x, v in _LOOP_SUFFIXES.items() if base.endswith(x)), None)
        self.verify = next((v for x, v in _VERIFY_SUFFIXES.items() if base.endswith(x)), None)
        gate = "auto" if base.endswith("-gate") else "off"
        name = base
        for suffix in (*_LOOP_SUFFIXES, *_VERIFY_SUFFIXES, "-gate"):
            name = name.removesuffix(suffix)
        # the system whose tokens this one must equal in its own quantization (losslessness)
        self.quant_reference = QUANT_REFERENCE if self.quant else None
        name = "ngram" if name == "ngram-bigram" else name
        if name not in methods_of("causal"):
            raise BenchError(f"unknown jaxspec method {method!r}")
        self.system, self.method = "jaxspec", label or method
        self.model, self.params = model, quantized_params(params) if self.quant else params
        self.entry = get_method(name, "causal")
        self.options = dict(
            max_new_tokens=int(max_new_tokens),
            draft_length=draft_length,
            max_ngram=max_ngram,
            min_ngram=min_ngram,
            fallback="bigram" if base == "ngram-bigram" else "none",
            gate=gate,
            **(options or {}),
        )
        self._budget_configs: dict[int, Any] = {}  # generation budget -> built method config
        self.kw = dict(eos_ids=tuple(int(e) for e in eos_ids), pad_id=int(pad_id))

    @property
    def name(self) -> str:
        return f"{self.system}/{self.method}"

    def run(self, ids: Sequence[int], max_new_tokens: Optional[int] = None) -> RunOutput:
        """Decode ``ids``; ``max_new_tokens`` overrides the budget (e.g. 1 for the time to
        the first token: another compiled loop, since the buffer size changes)."""
        budget = self.options["max_new_tokens"] if max_new_tokens is None else int(max_new_tokens)
        if budget not in self._budget_configs:  # each method takes the options it knows
            self._budget_configs[budget] = self.entry.configure(
                dict(self.options, max_new_tokens=budget), strict=False
            )
        if self.loop or self.verify:
            res, t0 = self.run_planned(ids, self._budget_configs[budget])
        else:
            t0 = time.perf_counter()
            res = self.entry.run(
                self.model, self.params, [list(ids)], self._budget_configs[budget], **self.kw
            )
        wall = time.perf_counter() - t0 - res.compile_s
        s = res.stats
        return RunOutput(
            tokens=res.tokens[0],
            seconds=wall,
            target_nfe=int(s.target_nfe.sum()),
            proposed=int(s.drafts_proposed.sum()),
            accepted=s.accepted_drafts,
            compile_s=res.compile_s,
            draft_nfe=int(s.draft_nfe.sum()),
            settings=dict(getattr(res, "settings", {})),
            steps=int(s.steps.sum()),
        )

    def run_planned(self, ids: Sequence[int], config):
        """``(result, start time)``: the causal decoder on an explicit decode plan with this
        system's layer loop / verification layout (:func:`jaxspec.causal.decode.decode_plan`,
        timed before the start)."""
        from jaxspec.causal.decode import decode_plan, generate

        drafter, dparams = config.drafter(self.model.config), config.drafter_params(self.params)
        plan = decode_plan(
            self.model,
            self.params,
            drafter,
            dparams,
            gate=config.gate_cost,
            layer_loop=self.loop or "auto",
            verify_layout=self.verify or "auto",
        )
        t0 = time.perf_counter()
        return generate(
            self.model,
            self.params,
            [list(ids)],
            drafter=drafter,
            max_new_tokens=config.max_new_tokens,
            sampling=config.sampling,
            drafter_params=dparams,
            plan=plan,
            **self.kw,
        ), t0


class TransformersSystem:
    """``transformers/ar``, ``transformers/prompt-lookup`` or ``transformers/assisted``
    (assisted generation with ``assistant`` as the draft model, exactly ``draft_length`` tokens
    per step: constant schedule, no confidence-threshold early stop; the SPS peer): greedy
    ``model.generate`` on our token ids (batch 1), stopping on the same EOS ids and budget.

    Target forwards are counted with a forward pre-hook on the model; the query length of each
    call after the first gives the number of candidates it verified.
    """

    def __init__(
        self,
        method: str,
        hf_model,
        *,
        max_new_tokens: int,
        eos_ids: Sequence[int],
        pad_id: int,
        draft_length: int = 8,
        max_ngram: int = 3,
        assistant=None,
    ):
        import torch
        from transformers import GenerationConfig

        if method not in ("ar", "prompt-lookup", "assisted"):
            raise BenchError(f"unknown transformers method {method!r}")
        if (method == "assisted") != (assistant is not None):
            raise BenchError(
                "transformers/assisted needs a draft model (--draft-model), and only it takes one"
            )
        self.assistant = assistant
        self.system, self.method = "transformers", method
        self.torch = torch
        self.model = hf_model
        self.max_new = int(max_new_tokens)
        self.eos_ids = tuple(int(e) for e in eos_ids)
        eos = list(self.eos_ids) or None
        # a clean generation config: nothing inherited from the weight file (sampling
        # defaults, repetition penalties, min lengths) may change what greedy decoding emits
        self.gen_config = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=self.max_new,
            min_length=0,
            eos_token_id=eos,
            pad_token_id=int(pad_id),
            temperature=None,
            top_p=None,
            top_k=None,
        )
        if method == "prompt-lookup":
            self.gen_config.prompt_lookup_num_tokens = int(draft_length)
            self.gen_config.max_matching_ngram_size = int(max_ngram)
        if method == "assisted":
            # transformers reads these from the *assistant's* generation config (its
            # AssistedCandidateGenerator copies assistant_model.generation_config); left alone,
            # the assistant drafts up to its default 20 tokens and stops early below its
            # confidence threshold (0.4), so the draft length would not be K
            ag = assistant.generation_config
            ag.num_assistant_tokens = int(draft_length)
            ag.num_assistant_tokens_schedule = "constant"
            ag.assistant_confidence_threshold = 0.0
        self._calls = _forward_log(hf_model)

    @property
    def name(self) -> str:
        return f"{self.system}/{self.method}"

    def run(self, ids: Sequence[int], max_new_tokens: Optional[int] = None) -> RunOutput:
        """Decode ``ids``; ``max_new_tokens`` overrides the budget (e.g. 1 for the time to
        the first token)."""
        torch = self.torch
        dev = next(self.model.parameters()).device
        x = torch.tensor([list(ids)], dtype=torch.long, device=dev)
        mask = torch.ones_like(x)
        budget = self.max_new if max_new_tokens is None else int(max_new_tokens)
        gen_config = self.gen_config
        if budget != self.max_new:
            gen_config = copy.deepcopy(self.gen_config)
            gen_config.max_new_tokens = budget
        self._calls.clear()
        t0 = time.perf_counter()
        with torch.inference_mode():
            extra = {} if self.assistant is None else {"assistant_model": self.assistant}
            out = self.model.generate(
                input_ids=x, attention_mask=mask, generation_config=gen_config, **extra
            )
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t0
        calls = list(self._calls)
        tokens = cut_output(out[0, x.shape[1] :].tolist(), self.eos_ids, budget)
        nfe = len(calls)
        proposed = accepted = 0
        if self.method in ("prompt-lookup", "assisted") and calls:
            # the first pass holds the prompt (+ candidates), later ones last token + candidates;
            # every pass emits exactly one target token besides the accepted candidates
            proposed = max(calls[0] - x.shape[1], 0) + sum(c - 1 for c in calls[1:])
            accepted = min(max(len(tokens) - nfe, 0), proposed)
        return RunOutput(
            tokens=tokens, seconds=wall, target_nfe=nfe, proposed=proposed, accepted=accepted
        )


def _forward_log(hf_model) -> list[int]:
    """The list a forward pre-hook on ``hf_model`` appends each call's query length to
    (installed once per model and shared by every system using it)."""
    log = getattr(hf_model, "_jaxspec_forward_log", None)
    if log is None:
        log = []

        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            log.append(int(ids.shape[1]) if ids is not None else 1)

        hf_model.register_forward_pre_hook(hook, with_kwargs=True)
        hf_model._jaxspec_forward_log = log
    return log


def torch_device(choice: str = "auto") -> str:
    """The transformers peers' device: ``"cpu"``, ``"cuda"``, or for ``"auto"`` ``"cuda"`` when
    JAX runs on a GPU and torch sees a CUDA device (the peer runs where jaxspec runs), else
    ``"cpu"``.

    Raises:
      BenchError: an unknown choice."""
    if choice in ("cpu", "cuda"):
        return choice
    if choice != "auto":
        raise BenchError(f"torch device must be auto, cpu or cuda, got {choice!r}")
    import jax

    if jax.default_backend() != "gpu":
        return "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_transformers_model(
    path, *, threads: Optional[int] = None, dtype: str = "float32", device: str = "cpu"
):
    """A PyTorch causal LM from the same weights: a GGUF file
    (``from_pretrained(dir, gguf_file=name)``) or an HF directory, in ``dtype`` (``"float32"``
    or ``"bfloat16"``), on ``device`` (``"cpu"`` or ``"cuda"``: the peer of jaxspec on a GPU).
    Sets torch's thread count to ``threads`` (default: all cores).

    Raises:
      BenchError: transformers/torch missing, ``device="cuda"`` without a CUDA device, or the
        weights cannot be loaded by transformers.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise BenchError(f"the transformers systems need torch and transformers ({e})") from None
    torch.set_num_threads(int(threads or os.cpu_count() or 1))
    p = Path(path)
    kw: dict[str, Any] = dict(dtype=getattr(torch, str(dtype)))
    if p.is_dir():
        src = str(p)
    else:
        src, kw["gguf_file"] = str(p.parent), p.name
    try:
        model = AutoModelForCausalLM.from_pretrained(src, **kw)
    except Exception as e:  # noqa: BLE001 - any loader failure is a one-line error for the CLI
        raise BenchError(
            f"transformers cannot load {p}: {' '.join(str(e).split())[:300]}"
        ) from None
    if device not in ("cpu", "cuda"):
        raise BenchError(f"torch device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("torch device cuda asked for, but torch sees no CUDA device")
    return model.to(device=device, dtype=getattr(torch, str(dtype))).eval()


# ----------------------------------------------------------------------------- bandwidth


def n_params(params) -> int:
    """Number of scalars in a parameter tree."""
    import jax

    return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)))


def streamed_params(params) -> int:
    """Number of weights one batch-1 decode step reads from memory: every parameter of a causal
    LM except, when it has its own ``lm_head``, the input embedding table, of which a step
    gathers one row (a tied table is the head and is read whole). The ``ar`` suite's bandwidth
    ceiling divides by these bytes: counting an untied table (Qwen2.5-Coder-0.5B's GGUF: 136M of
    630M) put the ceiling 21% low and the decode rate at 128% of it."""
    total = n_params(params)
    if isinstance(params, dict) and "lm_head" in params and "embed" in params:
        total -= int(np.prod(params["embed"].shape))
    return total


MATVEC_MAX_BYTES = 1 << 30


def matvec_bandwidth(
    num_params: int, reps: int = 5, rows: int = 4096, max_bytes: int = MATVEC_MAX_BYTES
) -> dict[str, float]:
    """Measure matrix-vector memory bandwidth over a float32 matrix the size of a model.

    Times ``W @ x`` (numpy/BLAS) for ``W`` float32 ``(rows, ceil(num_params / rows))``: every
    weight byte is read once per product, as in batch-1 decoding. One untimed product, then
    ``reps`` timed ones. The ceiling uses the fastest (other load on the machine only slows a
    product down); the median is reported beside it. The matrix is capped at ``max_bytes``
    (1 GiB, far past any CPU cache, so the rate is still DRAM streaming): a second
    model-sized copy of a 1.5B model (6.2 GB) next to the loaded models ran a 24 GB machine out
    of memory. Divide the model's bytes by ``gb_per_s`` for its ceiling.

    Returns:
      ``{"matrix_bytes", "matvec_s" (fastest seconds), "matvec_median_s", "gb_per_s"
      (1e9 bytes / s at the fastest product)}``.
    """
    product, nbytes = matvec_probe(num_params, rows, max_bytes)
    return _time_products(product, nbytes, reps)


def matvec_probe(
    num_params: int, rows: int = 4096, max_bytes: int = MATVEC_MAX_BYTES
) -> tuple[Callable[[], Any], int]:
    """``(product, matrix bytes)``: a numpy ``W @ x`` over the float32 matrix of
    :func:`matvec_bandwidth` (allocated once, here), to time whenever the machine's rate is
    wanted, e.g. after every prompt of the ``ar`` suite (:func:`run_ar_suite`)."""
    cols = max(1, -(-min(int(num_params), int(max_bytes) // 4) // rows))
    w = np.full((rows, cols), 1e-3, np.float32)
    x = np.ones((cols,), np.float32)
    return (lambda: w @ x), int(w.nbytes)


def _time_products(product: Callable[[], Any], nbytes: int, reps: int) -> dict[str, float]:
    """One untimed ``product()``, then ``reps`` timed ones (each must return when its result
    is ready); the rate is ``nbytes`` over the fastest. The return dict of
    :func:`matvec_bandwidth`."""
    product()
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        product()
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {
        "matrix_bytes": nbytes,
        "matvec_s": best,
        "matvec_median_s": statistics.median(times),
        "gb_per_s": nbytes / best / 1e9,
    }


def device_matvec_bandwidth(
    num_params: int,
    dtype: str = "float32",
    reps: int = 20,
    rows: int = 4096,
    max_bytes: int = MATVEC_MAX_BYTES,
) -> dict[str, float]:
    """:func:`matvec_bandwidth` on JAX's default device (a GPU or TPU): ``W @ x`` jitted, for
    ``W`` of ``dtype`` ``(rows, ceil(num_params / rows))`` held on the device, capped at
    ``max_bytes`` (1 GiB: far past any accelerator's L2 cache). One untimed product (the
    compile), then ``reps`` timed ones, each waited for (``block_until_ready``). Same return
    keys as :func:`matvec_bandwidth`."""
    import jax
    import jax.numpy as jnp

    itemsize = int(np.dtype(jnp.dtype(dtype)).itemsize)
    cols = max(1, -(-min(int(num_params), int(max_bytes) // itemsize) // rows))
    w = jnp.full((rows, cols), 1e-3, dtype)
    x = jnp.ones((cols,), dtype)
    f = jax.jit(lambda a, b: a @ b)
    return _time_products(lambda: f(w, x).block_until_ready(), rows * cols * itemsize, reps)


def bandwidth_ceiling(
    num_params: int, param_dtype: str = "float32", reps: int = 5
) -> dict[str, Any]:
    """The batch-1 decoding ceiling of a model of ``num_params`` weights in ``param_dtype``:
    every weight read once per token at the rate of a matrix-vector product on the device JAX
    runs on (:func:`matvec_bandwidth` on CPU, :func:`device_matvec_bandwidth` on an
    accelerator). Returns the ``bandwidth`` block of the ``ar`` suite's result document
    (``bandwidth_bound_tokens_per_s`` = rate / model bytes)."""
    import jax

    on_cpu = jax.default_backend() == "cpu"
    bw = (
        matvec_bandwidth(num_params, reps=reps)
        if on_cpu
        else device_matvec_bandwidth(num_params, param_dtype, reps=4 * reps)
    )
    model_bytes = int(np.dtype(jax.numpy.dtype(param_dtype)).itemsize) * int(num_params)
    return {
        "num_params": int(num_params),
        "param_dtype": str(param_dtype),
        "device": jax.default_backend(),
        "model_bytes": model_bytes,
        "model_bytes_f32": 4 * int(num_params),
        "matvec_matrix_bytes": int(bw["matrix_bytes"]),
        "matvec_gb_per_s": _num(bw["gb_per_s"], 2),
        "matvec_ms": _num(bw["matvec_s"] * 1e3, 2),
        "matvec_median_ms": _num(bw["matvec_median_s"] * 1e3, 2),
        "bandwidth_bound_tokens_per_s": _num(bw["gb_per_s"] * 1e9 / model_bytes, 2),
    }


# ----------------------------------------------------------------------------- the suite


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU model, core count and library versions."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for mod in ("jax", "jaxlib", "flax", "numpy", "torch", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent peers are simply not reported
            info[mod] = None
    try:
        import jax

        info["jax_backend"] = jax.default_backend()
        if info["jax_backend"] != "cpu":
            info["accelerator"] = jax.devices()[0].device_kind
    except Exception:  # noqa: BLE001
        pass
    return info


def _num(x: Optional[float], nd: int = 4) -> Optional[float]:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _order(systems: list, i: int) -> list:
    r = i % len(systems)
    return systems[r:] + systems[:r]


def _drift(system, outs: dict) -> dict:
    """Row fields comparing ``system``'s outputs with the baseline's (``identical_share``,
    ``first_divergence``: median over the differing prompts) and, for a system with a
    ``quant_reference``, with that system's (``identical_to_quant_reference``; None when it
    did not run or for the reference itself and for float systems)."""
    o = outs[system.name]
    div = [first_divergence(r.tokens, b.tokens) for b, r in zip(outs[BASELINE], o)]
    qref = getattr(system, "quant_reference", None)
    return {
        "identical_share": _num(sum(d is None for d in div) / len(div), 4),
        "first_divergence": (
            None
            if all(d is None for d in div)
            else statistics.median(d for d in div if d is not None)
        ),
        "identical_to_quant_reference": (
            all(r.tokens == b.tokens for b, r in zip(outs[qref], o))
            if qref in outs and qref != system.name
            else None
        ),
    }


def _measures_ttft(system) -> bool:
    """Whether the ``ar`` suite times ``system``'s first token: the autoregressive systems
    (``ar``, ``ar-scan``, ``ar-unrolled``, ``ar-int8``, transformers ``ar``), whose decode
    steps the bandwidth ceiling bounds."""
    return system.method == "ar" or system.method.startswith("ar-")


def _decode_rate(outs: Sequence[RunOutput], ttft: Optional[Sequence[float]]) -> dict:
    """``ttft_s`` (median seconds of a one-token run: prefill + first token) and
    ``decode_tokens_per_s`` (median over prompts of ``(new - 1) / (seconds - ttft)``: the
    decode steps alone, the rate the bandwidth ceiling bounds); None when not measured."""
    if not ttft:
        return {"ttft_s": None, "decode_tokens_per_s": None}
    rates = [r for r in _decode_rates(outs, ttft) if r is not None]
    return {
        "ttft_s": _num(statistics.median(ttft), 4),
        "decode_tokens_per_s": _num(statistics.median(rates), 3) if rates else None,
    }


def _decode_rates(outs: Sequence[RunOutput], ttft: Sequence[float]) -> list[Optional[float]]:
    """Per prompt, ``(new - 1) / (seconds - ttft)`` tokens/s, or None where it is undefined
    (one token, or a first token that took the whole call)."""
    return [
        (len(o.tokens) - 1) / (o.seconds - t) if len(o.tokens) > 1 and o.seconds > t else None
        for o, t in zip(outs, ttft)
    ]


def _paired_share(
    outs: Sequence[RunOutput],
    ttft: Optional[Sequence[float]],
    matvec_s: Sequence[float],
    matrix_bytes: int,
    model_bytes: int,
) -> Optional[float]:
    """Median over prompts of a system's decode rate over the bandwidth ceiling timed right
    after that prompt (``matrix_bytes / matvec_s[i]`` bytes/s over the model's bytes): the
    ceiling share with the machine's drift paired out. None without both measurements."""
    if not ttft or len(matvec_s) != len(outs):
        return None
    shares = [
        rate * model_bytes * t / matrix_bytes
        for rate, t in zip(_decode_rates(outs, ttft), matvec_s)
        if rate is not None
    ]
    return _num(statistics.median(shares), 3) if shares else None


def _on_cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"


def _interleaved_runs(
    systems: Sequence,
    prompts: Sequence[BenchPrompt],
    time_first: bool,
    progress: bool,
    log: Callable[[str], None],
    between: Optional[Callable[[], None]] = None,
):
    """The ``ar`` suite's protocol (module docstring): one untimed warm-up generation per
    system, then every prompt by every system in rotating order; with ``time_first`` the AR
    systems also rerun each prompt with a one-token budget right after; ``between`` is called
    after each prompt's systems.

    Returns ``(outputs {name: [RunOutput per prompt]}, first-token seconds {name: [...]} of
    the AR systems, compile seconds {name: float})``."""
    names = [s.name for s in systems]
    compile_s = {n: 0.0 for n in names}
    # the warm-up compiles jaxspec's first bucket; the AR systems' one-token budget too (its
    # compile is not counted)
    for s in systems:
        log(f"[bench] warm-up {s.name}")
        compile_s[s.name] += s.run(prompts[0].ids).compile_s
        if time_first and _measures_ttft(s):
            s.run(prompts[0].ids, max_new_tokens=1)
    ttft: dict[str, list[float]] = {s.name: [] for s in systems if time_first and _measures_ttft(s)}
    outs: dict[str, list[RunOutput]] = {n: [] for n in names}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="prompts", unit="prompt", leave=True)
    try:
        for i, p in enumerate(prompts):
            gc.collect()
            for s in _order(systems, i):
                o = s.run(p.ids)
                compile_s[s.name] += o.compile_s
                outs[s.name].append(o)
                if s.name in ttft:
                    ttft[s.name].append(s.run(p.ids, max_new_tokens=1).seconds)
            if between is not None:
                between()
            if bar is not None:
                bar.set_postfix_str(
                    " ".join(
                        f"{n.split('/')[0][:3]}/{n.split('/')[1][:5]}="
                        f"{len(outs[n][-1].tokens) / max(outs[n][-1].seconds, 1e-9):.1f}"
                        for n in names
                    )
                )
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return outs, ttft, compile_s


def _suite_row(
    s,
    outs: dict,
    model_name: str,
    compile_s: dict,
    ttft: Optional[Sequence[float]],
    paired: Optional[float],
) -> dict[str, Any]:
    """One system's row of the ``ar`` suite (:func:`run_ar_suite`) from every system's
    outputs ``outs`` (the baseline's included), its first-token seconds and paired ceiling
    share."""
    o, ref = outs[s.name], outs[BASELINE]
    new = sum(len(r.tokens) for r in o)
    nfe = sum(r.target_nfe for r in o)
    tps = [len(r.tokens) / max(r.seconds, 1e-9) for r in o]
    ratio = [b.seconds / max(r.seconds, 1e-9) for b, r in zip(ref, o)]
    proposed, accepted = sum(r.proposed for r in o), sum(r.accepted for r in o)
    drafts = s.method != "ar"
    return {
        "system": s.system,
        "method": s.method,
        "model": model_name,
        "prompts": len(o),
        "new_tokens": new,
        "median_tokens_per_s": _num(statistics.median(tps), 3),
        "mean_tokens_per_s": _num(statistics.fmean(tps), 3),
        "nfe_per_token": _num(nfe / max(new, 1)),
        "mat": _num(new / max(nfe, 1)),
        "acceptance_rate": _num(accepted / proposed) if drafts and proposed else None,
        "draft_nfe_per_token": _num(sum(r.draft_nfe for r in o) / max(new, 1)),
        # accepted draft tokens per decode step (the bonus / correction token not counted)
        "mean_accepted_length": (
            _num(accepted / max(sum(r.steps for r in o), 1), 3)
            if drafts and any(r.steps for r in o)
            else None
        ),
        "speedup_vs_baseline": _num(statistics.median(ratio), 3),
        "identical_to_reference": all(r.tokens == b.tokens for b, r in zip(ref, o)),
        **_drift(s, outs),
        "compile_s": _num(compile_s[s.name], 2) if s.system == "jaxspec" else None,
        "verify_layout": o[-1].settings.get("verify_layout"),
        "gate_cost": o[-1].settings.get("verify_cost"),
        **_decode_rate(o, ttft),
        "decode_share_paired": paired,
        **mean_degeneracy([r.tokens for r in o]),
    }


def run_ar_suite(
    systems: Sequence,
    prompts: Sequence[BenchPrompt],
    *,
    model_name: str,
    num_params: Optional[int] = None,
    param_dtype: str = "float32",
    config: Optional[dict] = None,
    progress: bool = True,
    bandwidth_reps: int = 5,
    decode: Optional[Callable[[list[int]], str]] = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the ``ar`` suite and return the result document (docs/results.md).

    Args:
      systems: objects with ``system``, ``method``, ``name`` and ``run(ids) -> RunOutput``
        (:class:`JaxspecSystem`, :class:`TransformersSystem`); one must be the baseline
        ``jaxspec/ar``.
      prompts: the prompts, in order.
      model_name: recorded in every row.
      num_params: target parameter count, for the memory-bandwidth ceiling (skipped if None).
        With it, the AR systems (:func:`_measures_ttft`) also run every prompt with a one-token
        budget, for the time to the first token and the rate of the decode steps alone
        (:func:`_decode_rate`), which the ceiling bounds.
      param_dtype: the target's weight dtype (its bytes per parameter set the ceiling). On CPU
        the ceiling's rate is a numpy float32 product (:func:`matvec_bandwidth`), on an
        accelerator a jitted product in ``param_dtype`` (:func:`device_matvec_bandwidth`).
      config: recorded as ``config``.
      progress: show a progress bar over prompts (stderr).
      bandwidth_reps: timed matrix-vector products for the bandwidth ceiling.
      decode: token ids -> text; when given, ``per_prompt`` records the reference output text
        (and the text of every system whose tokens differ from it).
      log: receives progress messages.

    Returns:
      ``{"suite", "date", "machine", "config", "bandwidth", "rows", "per_prompt"}``.

    Raises:
      BenchError: no prompts, or the baseline system is missing.
    """
    systems = list(systems)
    if not prompts:
        raise BenchError("no prompts to benchmark")
    names = [s.name for s in systems]
    if BASELINE not in names:
        raise BenchError(f"the baseline {BASELINE} must be among the systems")
    # on the CPU the ceiling's product is also timed after every prompt, to pair each prompt's
    # decode rate with the machine's rate at that moment (a shared machine drifts)
    matvec_s: list[float] = []
    probe, matrix_bytes = matvec_probe(num_params) if num_params and _on_cpu() else (None, 0)

    def time_probe():  # one untimed product (other libraries' threads settle), fastest of 3
        matvec_s.append(_time_products(probe, matrix_bytes, 3)["matvec_s"])

    outs, ttft, compile_s = _interleaved_runs(
        systems, prompts, bool(num_params), progress, log, between=time_probe if probe else None
    )
    model_bytes = int(np.dtype(param_dtype).itemsize) * int(num_params or 0)

    ref = outs[BASELINE]
    rows = [
        _suite_row(
            s,
            outs,
            model_name,
            compile_s,
            ttft.get(s.name),
            _paired_share(outs[s.name], ttft.get(s.name), matvec_s, matrix_bytes, model_bytes),
        )
        for s in systems
    ]
    per_prompt = []
    for i, p in enumerate(prompts):
        entry: dict[str, Any] = {"task_id": p.task_id, "prompt_tokens": len(p.ids), "systems": {}}
        for n in names:
            o = outs[n][i]
            same = o.tokens == ref[i].tokens
            entry["systems"][n] = {
                "new_tokens": len(o.tokens),
                "seconds": _num(o.seconds, 5),
                "ttft_s": _num(ttft[n][i], 5) if n in ttft else None,
                "tokens_per_s": _num(len(o.tokens) / max(o.seconds, 1e-9), 3),
                "target_nfe": o.target_nfe,
                "proposed": o.proposed,
                "accepted": o.accepted,
                "identical_to_reference": same,
                "first_divergence": first_divergence(o.tokens, ref[i].tokens),
            }
            if decode is not None and not same:
                entry["systems"][n]["output"] = decode(o.tokens)
        if decode is not None:
            entry["reference_output"] = decode(ref[i].tokens)
        per_prompt.append(entry)

    bandwidth = bandwidth_ceiling(num_params, param_dtype, bandwidth_reps) if num_params else None
    if bandwidth is not None and matvec_s:
        bandwidth["matvec_per_prompt_ms"] = [_num(t * 1e3, 2) for t in matvec_s]
        bandwidth["matvec_per_prompt_gb_per_s_median"] = _num(
            matrix_bytes / statistics.median(matvec_s) / 1e9, 2
        )
    return {
        "suite": "ar",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": dict(config or {}),
        "bandwidth_bound_tokens_per_s": None
        if bandwidth is None
        else bandwidth["bandwidth_bound_tokens_per_s"],
        "bandwidth": bandwidth,
        "rows": rows,
        "per_prompt": per_prompt,
    }


# ----------------------------------------------------------------------------- reporting

_COLUMNS = [
    ("system", "system", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("new_tokens", "new tokens", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
    ("ttft_s", "TTFT s", "{:.3f}"),
    ("mean_tokens_per_s", "mean tok/s", "{:.1f}"),
    ("speedup_vs_baseline", "speedup", "{:.2f}x"),
    ("nfe_per_token", "NFE/token", "{:.3f}"),
    ("mat", "MAT", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    ("identical_share", "ident. share", "{:.2f}"),
    ("first_divergence", "1st diff", "{:g}"),
    ("identical_to_quant_reference", "= int8 AR", "{}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("verify_layout", "verify layout", "{}"),
    ("gate_cost", "gate cost", "{:.2f}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
    ("longest_run", "longest run", "{}"),
]


# Columns of :func:`jaxspec.eval.metrics.answer_degeneracy` (diffusion suites): degeneracy of the
# text before the first EOS, the answer length and the EOS-tail share.
ANSWER_COLUMNS = (
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
    ("longest_run", "longest run", "{}"),
    ("answer_tokens", "answer tokens", "{:.1f}"),
    ("eos_share", "EOS share", "{:.2f}"),
)
ANSWER_NOTE = (
    "- `distinct`, `rep. 4-gram`, `longest run`: degeneracy of the text before each "
    "output's first EOS (a looping model agrees with itself and inflates acceptance); "
    "`answer tokens`: its mean length; `EOS share`: share of the generated positions "
    "that hold EOS, the tail an instruct dLLM pads its blocks with. EOS tails are easy "
    "to accept and decode, as in the papers' figures: read speedups beside this share."
)


def markdown_table(result: dict, columns=None) -> str:
    """The rows of a result document as a GitHub markdown table; ``columns`` is a list of
    ``(key, header, format)`` (default: the ``ar`` suite's). ``None`` prints ``-``, booleans
    ``yes`` / ``NO``."""
    columns = _COLUMNS if columns is None else columns
    lines = [
        "| " + " | ".join(h for _, h, _ in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for r in result["rows"]:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cells.append(
                "-"
                if v is None
                else (("yes" if v else "NO") if isinstance(v, bool) else fmt.format(v))
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MAT_DEFINITION = (
    "`MAT` = generated tokens / target forwards (prefill counted, the bonus or "
    "correction token of each step counted); AR has MAT 1."
)


def report_header(title: str, result: dict, *, peers: bool = False) -> list[str]:
    """The first lines of a suite's markdown page: title; date / CPU / cores / accelerator (when
    JAX ran on one) / jax, plus torch and transformers when ``peers`` (suites that time the
    transformers peers); and the config."""
    m, c = result["machine"], result.get("config") or {}
    line = (
        f"{result['date']} · {m.get('cpu')} · {m.get('cores')} cores"
        + (f" · {m['accelerator']}" if m.get("accelerator") else "")
        + f" · jax {m.get('jax')}"
        + (f" · torch {m.get('torch')} · transformers {m.get('transformers')}" if peers else "")
    )
    out = [f"# {title}", "", line, ""]
    return out + (["Config: " + ", ".join(f"`{k}={v}`" for k, v in c.items()), ""] if c else [])


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


def save_figure(fig, out: Path, title: Optional[str] = None) -> Path:
    """Give ``fig`` its (small) title, lay it out, write it to ``out`` as PNG and close it."""
    from jaxspec.core.plotting import pyplot

    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def plot_k_sweep(ax, rows: list, xlabel: str, title: str) -> None:
    """MAT and the wall-clock speedup vs AR of ``rows`` (each with ``k``, ``mat``,
    ``speedup_vs_baseline``) against ``k`` on ``ax``, with the break-even line at 1."""
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["mat"] for r in rows], "o-", label="MAT")
    ax.plot(ks, [r["speedup_vs_baseline"] for r in rows], "s-", label="wall-clock speedup vs AR")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    ax.set_title(title)


def _ceiling_shares(result: dict) -> str:
    """`` jaxspec/ar's decode steps reach X% of it ...``: each AR system's decode rate (and
    end-to-end rate) as a share of the bandwidth ceiling; empty without decode rates."""
    bound = result.get("bandwidth_bound_tokens_per_s")
    parts = [
        f"`{r['system']}/{r['method']}` {100 * r['decode_tokens_per_s'] / bound:.0f}% "
        f"(end to end, prefill included: {100 * r['median_tokens_per_s'] / bound:.0f}%)"
        for r in result.get("rows", ())
        if bound and r.get("decode_tokens_per_s")
    ]
    paired = [
        f"`{r['system']}/{r['method']}` {100 * r['decode_share_paired']:.0f}%"
        for r in result.get("rows", ())
        if r.get("decode_share_paired")
    ]
    bw = result.get("bandwidth") or {}
    note = (
        (
            " Paired with the same product timed right after each prompt (fastest of 3; median "
            f"{bw.get('matvec_per_prompt_gb_per_s_median')} GB/s; the machine's rate drifts "
            "during a run), the median over prompts of decode rate / that prompt's ceiling: "
            + "; ".join(paired)
            + "."
        )
        if paired
        else ""
    )
    return (
        (
            " Decode steps alone (`decode tok/s`) reach, of this ceiling: "
            + "; ".join(parts)
            + "."
            + note
        )
        if parts
        else ""
    )


def markdown_report(result: dict) -> str:
    """Full markdown page: header, table, the memory-bandwidth ceiling and how to read it."""
    bw = result.get("bandwidth")
    out = report_header(f"Benchmark suite `{result['suite']}`", result, peers=True)
    out += [markdown_table(result), ""]
    if bw:
        dt = bw.get("param_dtype", "float32")
        where = "" if bw.get("device", "cpu") == "cpu" else f" on the {bw['device'].upper()}"
        out += [
            f"**Memory-bandwidth ceiling for batch-1 {dt} decoding{where}: "
            f"{bw['bandwidth_bound_tokens_per_s']:.1f} tokens/s** "
            f"({bw.get('model_bytes', bw['model_bytes_f32']) / 1e9:.3g} GB "
            f"of {dt} weights read at {bw['matvec_gb_per_s']:.1f} GB/s, the rate of a "
            f"matrix-vector product over a "
            f"{bw.get('matvec_matrix_bytes', bw['model_bytes_f32']) / 1e9:.3g} GB {dt} "
            f"matrix: fastest of several passes {bw['matvec_ms']:.2f} ms, "
            f"median {bw['matvec_median_ms']:.1f} ms). A decoder that "
            f"runs one target forward per token cannot beat it; speculative decoding can, "
            f"because one forward verifies several tokens." + _ceiling_shares(result),
            "",
        ]
    out += [
        "How to read this:",
        "",
        "- All systems decode the same token ids greedily at batch 1, in one process, interleaved "
        "prompt by prompt (the order rotates); warm-up and compilation are excluded "
        "(compilation is listed under `compile s`).",
        "- `median tok/s` is the median over prompts of new tokens / wall-clock seconds; "
        "`speedup` is the median over prompts of the per-prompt wall-clock ratio against "
        f"`{BASELINE}` of this same run.",
        "- `decode tok/s` (AR systems) is the median over prompts of (new tokens - 1) / "
        "(seconds - TTFT), where `TTFT s` is the wall-clock time of the same call with a "
        "one-token budget (prefill and first token; its compile not counted): the rate of the "
        "decode steps alone, which the bandwidth ceiling bounds.",
        "- `NFE/token` counts target-model forward passes (the prompt pass included) per "
        "generated token, hardware-independent; `MAT` is its inverse, tokens per forward. "
        "`acceptance` is accepted / verified draft tokens: `jaxspec/ngram` and transformers' "
        "prompt lookup verify K drafts only when a suffix matches (otherwise they run a plain "
        "AR step); `jaxspec/ngram-bigram` always verifies K drafts (bigram fallback).",
        f"- `identical` says whether every prompt's output equals `{BASELINE}`'s token for token "
        "(greedy speculative decoding is lossless; a different implementation in float32 can "
        "still flip a near-tie).",
        "- `ident. share` is the share of prompts whose output equals the reference's; `1st diff` "
        "the median over the other prompts of the first generated position that differs. "
        "The `-int8` systems (weight-only int8 matrices) change the model, so they drift from "
        f"`{BASELINE}`; `= int8 AR` says whether they equal AR decoding of the same int8 model "
        "(losslessness holds within one quantization).",
        "- `distinct`, `rep. 4-gram` and `longest run` are degeneracy figures of the outputs: a "
        "looping model inflates acceptance and speedup.",
        "- Wall-clock ratios are only meaningful within one run; compare NFE across machines.",
    ]
    return "\n".join(out) + "\n"


def plot_per_prompt(result: dict, out: Path) -> Path:
    """Plot per-prompt throughput of every system (dots) with each system's median (line)
    and the memory-bandwidth ceiling; write it as PNG to ``out``."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()

    prompts = result["per_prompt"]
    names = [f"{r['system']}/{r['method']}" for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(prompts) + 2), 4.2))
    x = np.arange(len(prompts))
    for i, name in enumerate(names):
        y = [p["systems"][name]["tokens_per_s"] for p in prompts]
        line = ax.plot(x + (i - len(names) / 2) * 0.08, y, "o", ms=4, label=name)[0]
        ax.axhline(float(np.median(y)), color=line.get_color(), lw=1, alpha=0.6)
    bound = result.get("bandwidth_bound_tokens_per_s")
    if bound:
        ax.axhline(bound, color="k", ls="--", lw=1, label="f32 bandwidth ceiling (1 forward/token)")
    ax.set_xticks(x, [p["task_id"].split("/")[-1] for p in prompts])
    ax.set_xlabel(f"prompt ({prompts[0]['task_id'].split('/')[0]} index)" if prompts else "prompt")
    ax.set_ylabel("tokens / s (wall clock)")
    ax.set_title(
        f"suite {result['suite']}: {result['rows'][0]['model']}, greedy, batch 1 (lines: medians)"
    )
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    return save_figure(fig, out)


def write_results(
    result: dict,
    out: Path,
    *,
    report: Callable[[dict], str] = None,
    plot: Callable[[dict, Path], Path] = None,
    caption: str = "per-prompt throughput",
) -> tuple[Path, Path]:
    """Write ``result`` as JSON to ``out``, the markdown report next to it (``.md``) and the
    chart (``.png``, linked from the report). ``report`` / ``plot`` default to this suite's
    :func:`markdown_report` / :func:`plot_per_prompt`."""
    import json

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    _replace_atomically(out, lambda tmp: tmp.write_text(text))
    png = out.with_suffix(".png")
    _replace_atomically(png, lambda tmp: (plot or plot_per_prompt)(result, tmp))
    md = out.with_suffix(".md")
    text = (report or markdown_report)(result) + f"\n![{caption}]({png.name})\n"
    _replace_atomically(md, lambda tmp: tmp.write_text(text))
    return out, md


def _replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` to a temporary file beside ``path`` (same suffix), then rename it over
    ``path``: a reader, or a run that fails half-way, never sees a half-written file."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
