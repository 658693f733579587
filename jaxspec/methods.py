"""The method registry: every decoding method, one entry each.

An entry says which model family the method runs on, how to build its config from the
user's options (:class:`DecodeOptions`, what ``scripts.generate`` reads from the command
line), how to run it, and which method it is lossless against. ``scripts.generate``
(``--method``, ``--compare``), ``scripts.benchmark`` (the ``jaxspec/<method>`` systems of
the ``ar`` suite) and the registry-driven losslessness tests (``tests/test_methods.py``)
read this table; adding a method is adding one :class:`Method` to :data:`METHODS`.

Families and their input: ``causal`` and ``dllm`` methods take prompts (lists of token ids);
``asarm`` methods take infilling tasks ``(tokens, masked)`` (:mod:`jaxspec.asarm`).
Every ``run`` returns a result with ``.tokens`` (per row) and ``.stats``
(:class:`jaxspec.core.stats.DecodeStats`), ``.compile_s`` and ``.run_s``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from jaxspec.asarm.assd import assd_generate
from jaxspec.causal.decode import generate as causal_generate
from jaxspec.causal.diffuspec import DiffusionDrafter
from jaxspec.causal.hetero import hetero_generate
from jaxspec.causal.space import SPACE_SAMPLING, SpaceDrafter
from jaxspec.causal.sps import DraftModelDrafter
from jaxspec.core.drafters import NgramDrafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.dllm import (DiffusionDecodeConfig, SpiffyConfig, SSDConfig, diffusion_generate,
                          load_graph, spiffy_generate, ssd_generate)
from jaxspec.dllm.spiffy import DraftGraph

FAMILIES = ("causal", "dllm", "asarm")
DEFAULT_GRAPH = "configs/graphs/dream-smollm2-135m/D10.json"


class MethodError(ValueError):
    """Unknown method, a method used with the wrong model family, or options it cannot take."""


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """Every user-facing decoding option (the ``scripts.generate`` flags), with their
    defaults. A method reads the ones it needs; ``None`` means "the method's default".

    Attributes (units: tokens unless said otherwise):
      max_new_tokens: causal generation budget per row.
      temperature, top_k, top_p: the target distribution (0 = greedy; 0 / 1.0 = off).
      draft_length: k (n-gram default 8, SPS 5, SSD 3, ASSD 5).
      max_ngram, min_ngram, fallback: n-gram drafter (``"none"`` or ``"bigram"``).
      gate: n-gram cost gate (:func:`jaxspec.causal.decode.tune_verification`): ``"off"``
        (the default: it bought nothing measurable, README "Verification tuned per machine"),
        ``"auto"`` (measured on the CPU's unrolled loop, off on GPU/TPU), or the cost of a
        verification pass in one-token steps (a number >= 1).
      gen_length, block_length, steps, remasking, tokens_per_step, threshold, cache,
      alg_temp, confidence_softmax: masked-diffusion decoding
      (:class:`jaxspec.dllm.DiffusionDecodeConfig`).
      tree: SSD verification tree (``"chain"`` or ``"mix-order"``).
      graph: Spiffy draft-graph JSON path.
      epsilon: ASSD acceptance tolerance (> 0 is not lossless).
      draft_model: SPS draft model, a ``(CausalLM, params)`` pair with the target's
        vocabulary (``scripts.generate --draft-model NAME`` loads it); not compared or hashed.
      mask_groups: SPACE's k (candidates per step = masks per group; paper default 5).
      space_sampling: SPACE's rule after a rejection: ``"exact"`` (residual) or ``"paper"``.
      dllm_drafter: DiffuSpec's drafter, a ``(DiffusionLM, params)`` pair with the target's
        vocabulary; proxy: its causal proxy (:class:`jaxspec.causal.diffuspec.NgramProxy` or
        None); k_min: ADL's lower clip (``draft_length`` is k_max, default 30); eos_id: the
        EOS the CPS lattice keeps. Not compared or hashed. cps / adl: the Table 2 ablations;
        refine_steps: S; drafter_cache: ``"none"`` (every drafter forward re-reads the
        context, the paper's setting) or ``"prefix"`` (the drafter keeps the context's
        keys / values, :class:`jaxspec.causal.diffuspec.DrafterCache`; same vocabulary only).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_length: Optional[int] = None
    max_ngram: int = 3
    min_ngram: int = 2
    fallback: str = "none"
    gate: Any = "off"
    gen_length: int = 64
    block_length: int = 8
    steps: Optional[int] = None
    remasking: str = "low_confidence"
    tokens_per_step: Optional[int] = None
    threshold: Optional[float] = None
    cache: str = "none"
    alg_temp: float = 0.0
    tree: str = "chain"
    graph: Optional[str] = None
    epsilon: float = 0.0
    draft_model: Any = dataclasses.field(default=None, compare=False)
    mask_groups: int = 5
    space_sampling: str = "exact"
    dllm_drafter: Any = dataclasses.field(default=None, compare=False)
    proxy: Any = dataclasses.field(default=None, compare=False)
    k_min: int = 20
    eos_id: int = 0
    cps: bool = True
    adl: bool = True
    refine_steps: int = 1
    drafter_cache: str = "none"
    vocab_adapter: Any = dataclasses.field(default=None, compare=False)
    confidence_softmax: str = "official"

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def diffusion(self, **overrides) -> DiffusionDecodeConfig:
        """The masked-diffusion decode config of these options (``steps`` defaults to the
        generation length)."""
        kw = dict(gen_length=self.gen_length, block_length=self.block_length,
                  steps=self.gen_length if self.steps is None else self.steps,
                  remasking=self.remasking, temperature=self.temperature, top_k=self.top_k,
                  top_p=self.top_p, cache=self.cache, tokens_per_step=self.tokens_per_step,
                  threshold=self.threshold, alg_temp=self.alg_temp,
                  confidence_softmax=self.confidence_softmax)
        kw.update(overrides)
        return DiffusionDecodeConfig(**kw)


@dataclasses.dataclass(frozen=True)
class Method:
    """One registry entry.

    Attributes:
      name: the ``--method`` value.
      family: ``"causal"``, ``"dllm"`` or ``"asarm"`` (:data:`FAMILIES`).
      reference: the method it is lossless against (itself for a reference decoder).
      summary: one line for ``--help`` and the README.
      build: ``options -> config`` (validates; raises ``ValueError`` naming the problem).
      run: ``(model, params, inputs, config, *, seed, eos_ids, pad_id) -> result``.
      reference_options: ``options -> options`` of the reference run for ``--compare``
        (default: the same options).
      lossless: False for methods that are not lossless against any reference (fixed-k and
        threshold parallel decoding): ``--compare`` then reports a difference, not an error.
    """

    name: str
    family: str
    reference: str
    summary: str
    build: Callable[[DecodeOptions], Any]
    run: Callable[..., Any]
    reference_options: Callable[[DecodeOptions], DecodeOptions] = lambda o: o
    lossless: bool = True


# ----------------------------------------------------------------------------- causal

def _causal_config(drafter_fn, params_fn=lambda o: (), adapter: bool = False):
    def build(o: DecodeOptions):
        if o.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {o.max_new_tokens}")
        return {"sampling": o.sampling, "max_new_tokens": o.max_new_tokens,
                "drafter": drafter_fn(o), "drafter_params": params_fn(o), "gate": _gate(o),
                "adapter": o.vocab_adapter if adapter else None}
    return build


def _gate(o: DecodeOptions):
    g = o.gate
    if isinstance(g, str) and g not in ("auto", "off"):
        try:
            g = float(g)
        except ValueError:
            raise ValueError(f"unknown --gate {o.gate!r}; expected auto, off or a verification "
                             "pass cost >= 1 (one-token steps)") from None
    if not isinstance(g, str) and not g >= 1.0:
        raise ValueError(f"--gate must be >= 1 (one-token steps), got {g}")
    return g


def _draft_length(o: DecodeOptions, default: int) -> int:
    k = default if o.draft_length is None else o.draft_length
    if k < 1:
        raise ValueError(f"--draft-length must be >= 1, got {k}")
    return k


def _ngram_drafter(o: DecodeOptions):
    k = _draft_length(o, 8)
    if o.fallback not in ("none", "bigram"):
        raise ValueError(f"unknown n-gram fallback {o.fallback!r}; expected none or bigram")
    return lambda config: NgramDrafter(k, config.vocab_size, max_ngram=o.max_ngram,
                                       min_ngram=o.min_ngram,
                                       bigram_fallback=o.fallback == "bigram")


def _sps_model(o: DecodeOptions):
    if o.draft_model is None:
        raise ValueError("method 'sps' needs a draft model: --draft-model NAME (a causal model "
                         "with the target's tokenizer)")
    return o.draft_model


def _sps_drafter(o: DecodeOptions):
    k = _draft_length(o, 5)
    dmodel, _ = _sps_model(o)
    return lambda config: DraftModelDrafter(dmodel, k, o.sampling)


def _space_drafter(o: DecodeOptions):
    if o.mask_groups < 1:
        raise ValueError(f"--mask-groups must be >= 1, got {o.mask_groups}")
    if o.space_sampling not in SPACE_SAMPLING:
        raise ValueError(f"unknown --space-sampling {o.space_sampling!r}; expected one of "
                         f"{', '.join(SPACE_SAMPLING)}")

    def make(config):
        if config.mask_token_id is None:
            raise ValueError("method 'space' needs a SAR-SFT model with a [MASK] token "
                             "(e.g. --model smollm2-135m-space)")
        return SpaceDrafter(o.mask_groups, config.vocab_size, config.mask_token_id, o.sampling,
                            o.space_sampling)
    return make


def _diffuspec_drafter(specdiff: bool):
    def make_from(o: DecodeOptions):
        if o.dllm_drafter is None:
            raise ValueError("method 'diffuspec' / 'specdiff' needs a diffusion drafter: "
                             "--draft-model NAME (e.g. dream-smollm2-135m)")
        k = _draft_length(o, 30)
        cps, adl = (False, False) if specdiff else (o.cps, o.adl)
        kmin = min(o.k_min, k) if adl else k
        if o.drafter_cache not in ("none", "prefix"):
            raise ValueError(f"drafter_cache must be 'none' or 'prefix', got {o.drafter_cache!r}")
        if o.drafter_cache == "prefix" and o.vocab_adapter is not None:
            raise ValueError("drafter_cache 'prefix' needs the target's vocabulary: a drafter of "
                             "another vocabulary re-encodes its context every step")
        dmodel, _ = o.dllm_drafter
        drafter = DiffusionDrafter(dmodel, k, eos_id=o.eos_id, k_min=kmin, cps=cps, adl=adl,
                                   refine_steps=o.refine_steps,
                                   prefix_cache=o.drafter_cache == "prefix")  # validates now
        return lambda config: drafter
    return make_from


def _diffuspec_params(o: DecodeOptions):
    return (o.dllm_drafter[1], o.proxy)


def _run_causal(model, params, prompts, config, *, seed=0, eos_ids=(), pad_id=0):
    make = config["drafter"]
    drafter = None if make is None else make(model.config)
    if config.get("adapter") is not None:  # a drafter of another vocabulary
        target_tok, drafter_tok = config["adapter"]
        return hetero_generate(model, params, prompts, drafter=drafter,
                               drafter_params=config["drafter_params"],
                               target_tokenizer=target_tok, drafter_tokenizer=drafter_tok,
                               max_new_tokens=config["max_new_tokens"],
                               sampling=config["sampling"], seed=seed, eos_ids=eos_ids,
                               pad_id=pad_id)
    return causal_generate(model, params, prompts, max_new_tokens=config["max_new_tokens"],
                           sampling=config["sampling"], drafter=drafter,
                           drafter_params=config.get("drafter_params", ()), seed=seed,
                           eos_ids=eos_ids, pad_id=pad_id, gate=config.get("gate", "off"))


# ----------------------------------------------------------------------------- dllm

def _stepwise(o: DecodeOptions):
    # stepwise by schedule; with --tokens-per-step / --threshold the config itself selects
    # fixed-k / threshold unmasking (DiffusionDecodeConfig.method)
    return o.diffusion()


def _fixed_k(o: DecodeOptions):
    if o.tokens_per_step is None:
        raise ValueError("method 'fixed-k' needs --tokens-per-step K")
    return o.diffusion()


def _threshold(o: DecodeOptions):
    if o.threshold is None:
        raise ValueError("method 'threshold' needs --threshold T")
    return o.diffusion()


def _one_token_per_step(o: DecodeOptions) -> DecodeOptions:
    return dataclasses.replace(o, steps=o.gen_length, tokens_per_step=None, threshold=None,
                               alg_temp=0.0)


def _ssd(o: DecodeOptions):
    if o.tokens_per_step is not None or o.threshold is not None or o.steps not in (None, o.gen_length):
        raise ValueError("ssd verifies one-token-per-step stepwise decoding: no "
                         "--tokens-per-step / --threshold, and --steps must equal --gen-length")
    return SSDConfig(o.diffusion(steps=o.gen_length), 3 if o.draft_length is None else o.draft_length,
                     o.tree)


def _spiffy(o: DecodeOptions):
    if o.graph:
        return SpiffyConfig(o.diffusion(), load_graph(o.graph))
    return SpiffyConfig(o.diffusion(), default_graph(o.block_length))


def default_graph(block_length: int):
    """The default draft graph (:data:`DEFAULT_GRAPH`, calibrated at block 32) without the
    formulas that name a position rank above ``block_length``: they cannot be drafted in a
    smaller block. Their descendants name it too, so the rest is still a valid graph (Eqs.
    6-8), and any graph keeps Spiffy lossless. A graph given by name is never pruned (a
    rank above the block length is an error there)."""
    g = load_graph(Path(__file__).resolve().parents[1] / DEFAULT_GRAPH)  # any working dir
    keep = [n for n, f in enumerate(g.formulas) if max(i for i, _ in f) <= block_length]
    if len(keep) == len(g.formulas):
        return g
    return DraftGraph(tuple(g.formulas[n] for n in keep),
                      tuple(g.counts[n] for n in keep) if g.counts else (), g.meta)


def _spiffy_reference(o: DecodeOptions) -> DecodeOptions:
    return dataclasses.replace(o, graph=None)


# ----------------------------------------------------------------------------- asarm

def _assd_config(method: str):
    def build(o: DecodeOptions):
        k = _draft_length(o, 5)
        if o.epsilon and method == "sequential":
            raise ValueError("--epsilon applies to ASSD only")
        return {"method": method, "k": k, "sampling": o.sampling, "epsilon": o.epsilon}
    return build


def _run_assd(model, params, tasks, config, *, seed=0, eos_ids=(), pad_id=0):
    """``tasks``: ``B`` pairs ``(tokens, masked)`` (:func:`jaxspec.asarm.assd.assd_generate`)."""
    tokens = [t for t, _ in tasks]
    masked = [m for _, m in tasks]
    return assd_generate(model, params, tokens, masked, seed=seed, **config)


# ----------------------------------------------------------------------------- the table

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "causal", "ar", "autoregressive decoding (the causal reference)",
           _causal_config(lambda o: None), _run_causal),
    Method("ngram", "causal", "ar", "context n-gram drafts + chain verification",
           _causal_config(_ngram_drafter), _run_causal),
    Method("sps", "causal", "ar", "draft-model speculative sampling (a small causal LM drafts)",
           _causal_config(_sps_drafter, lambda o: _sps_model(o)[1]), _run_causal),
    Method("space", "causal", "ar", "SPACE auto-correct decoding (a SAR-SFT model drafts in "
           "its own forward)", _causal_config(_space_drafter), _run_causal),
    Method("diffuspec", "causal", "ar", "DiffuSpec: a diffusion LM drafts a block, CPS + ADL, "
           "point-mass verification", _causal_config(_diffuspec_drafter(False),
                                                    _diffuspec_params, adapter=True), _run_causal),
    Method("specdiff", "causal", "ar", "SpecDiff: a diffusion LM's argmax block, fixed length "
           "(DiffuSpec without CPS and ADL)", _causal_config(_diffuspec_drafter(True),
                                                             _diffuspec_params, adapter=True), _run_causal),
    Method("stepwise", "dllm", "stepwise", "LLaDA/Dream stepwise unmasking (the dLLM reference)",
           _stepwise, diffusion_generate, _one_token_per_step),
    Method("fixed-k", "dllm", "stepwise", "fixed-k parallel unmasking (not lossless)",
           _fixed_k, diffusion_generate, _one_token_per_step, lossless=False),
    Method("threshold", "dllm", "stepwise", "Fast-dLLM confidence-threshold unmasking (not lossless)",
           _threshold, diffusion_generate, _one_token_per_step, lossless=False),
    Method("ssd", "dllm", "stepwise", "SSD self-speculative decoding, hierarchical verification",
           _ssd, ssd_generate, _one_token_per_step),
    Method("spiffy", "dllm", "stepwise", "Spiffy draft graphs (lossless against the decoder "
           "it accelerates: stepwise, fixed-k or threshold)",
           _spiffy, spiffy_generate, _spiffy_reference),
    Method("sequential", "asarm", "sequential", "sequential any-order decoding (the AS-ARM reference)",
           _assd_config("sequential"), _run_assd),
    Method("assd", "asarm", "sequential", "ASSD Algorithm 1 (self-drafted)",
           _assd_config("assd"), _run_assd),
    Method("assd-ngram", "asarm", "sequential", "ASSD Algorithm 2 (context bigram drafts)",
           _assd_config("assd-ngram"), _run_assd),
    Method("assd-fused", "asarm", "sequential", "fused ASSD: one AS-ARM call verifies the "
           "drafts and drafts the next ones (k+1 query groups)", _assd_config("assd-fused"),
           _run_assd),
    Method("assd-fused-ngram", "asarm", "sequential", "fused ASSD with context bigram drafts "
           "(one call per iteration, bonus row)", _assd_config("assd-fused-ngram"), _run_assd),
)}


def get_method(name: str, family: Optional[str] = None) -> Method:
    """The registry entry ``name``.

    Raises:
      MethodError: unknown name, or a method of another family than ``family``.
    """
    if name not in METHODS:
        raise MethodError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    m = METHODS[name]
    if family is not None and m.family != family:
        fits = ", ".join(n for n, x in METHODS.items() if x.family == family)
        raise MethodError(f"method {name!r} needs a {m.family} model, but the model is "
                          f"{family}; use --method {fits}")
    return m


def methods_of(family: str) -> tuple[str, ...]:
    """Names of the methods of one family, in registry order."""
    return tuple(n for n, m in METHODS.items() if m.family == family)


def reference_run(method: Method, options: DecodeOptions) -> tuple[Method, Any]:
    """The reference method and its config for ``--compare`` (Spiffy's reference is the
    decoder it accelerates, so its options decide between stepwise / fixed-k / threshold)."""
    ref_opts = method.reference_options(options)
    if method.name == "spiffy":
        ref = get_method(ref_opts.diffusion().method)
    else:
        ref = get_method(method.reference)
    return ref, ref.build(ref_opts)


def run_method(name: str, model, params, inputs: Sequence, options: DecodeOptions = DecodeOptions(),
               *, family: Optional[str] = None, seed: int = 0, eos_ids: Sequence[int] = (),
               pad_id: int = 0):
    """Build and run one method: ``get_method(name, family).run(...)`` (the library's one-call
    entry point). Raises :class:`MethodError` / ``ValueError`` on bad input."""
    m = get_method(name, family)
    return m.run(model, params, inputs, m.build(options), seed=seed,
                 eos_ids=tuple(eos_ids), pad_id=pad_id)
