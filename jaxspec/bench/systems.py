"""The systems of the ``ar`` suite (:mod:`jaxspec.bench.ar_suite`): their names
(:data:`SYSTEMS`, :func:`parse_systems`), ``jaxspec/<method>`` (:class:`JaxspecSystem`) and
the transformers peers (:class:`TransformersSystem`, :func:`load_transformers_model`)."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from jaxspec.bench.records import BenchError, RunOutput, cut_output
from jaxspec.methods import get_method, methods_of

SUITES = ("ar", "dllm", "ssd", "spiffy", "assd", "space", "diffuspec", "dflash")
# every causal method of the registry is a jaxspec system; ngram-bigram is the n-gram drafter
# with the Eq. 23 fallback
# layout / quantisation variants of AR and n-gram (below), on request only
VARIANTS = (
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
SYSTEMS = (
    tuple(f"jaxspec/{m}" for m in methods_of("causal"))
    + ("jaxspec/ngram-bigram",)
    + VARIANTS
    + (
        "transformers/ar",
        "transformers/prompt-lookup",
        "transformers/assisted",
    )
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
ON_REQUEST = NEEDS_MORE + VARIANTS
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if s not in ON_REQUEST)


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
