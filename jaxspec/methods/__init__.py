"""The method registry and the one decode call: every decoding method, one entry each.

Use::

    from jaxspec.methods import get_method, run

    config = get_method("ngram").configure(max_new_tokens=64, draft_length=4)
    result = run("ngram", model, params, prompts, config, seed=0)
    result.tokens, result.stats, result.compile_s, result.run_s

:func:`run` takes every method of every family in the same shape (``causal`` and ``dllm``
methods decode prompts, lists of token ids; ``asarm`` methods fill infilling tasks, pairs
``(tokens, masked)``) and returns a :class:`jaxspec.core.results.DecodeResult` subclass. It
checks the model's family, the inputs' types and what the method needs (a draft model, a
[MASK] token) before anything compiles; every error is one line (``ValueError`` /
``TypeError`` / :class:`MethodError`).

**A method is one registry entry plus its module.** The module holds the method's config, a
frozen dataclass subclassing its family's config (:class:`jaxspec.causal.config.CausalConfig`,
:class:`jaxspec.methods.dllm.DllmConfig`, :class:`jaxspec.methods.asarm.SequentialConfig`;
all :class:`jaxspec.core.method_config.MethodConfig`): its fields are the method's knobs,
named as the ``scripts.generate`` options (``draft_length`` is ``--draft-length``), one
:class:`~jaxspec.core.sampling.SamplingConfig`, and its validation in ``__post_init__``
(one-line ``ValueError`` naming the option, value and allowed range). Class attributes
declare what it needs (:class:`~jaxspec.core.method_config.Needs`) and the method it is
lossless against; methods give its drafter (causal) or decoder (:meth:`decode`), its
reference run (:meth:`reference`), model-dependent bounds (:meth:`check_model`) and its stats
lines (:meth:`report`). To add a method:

1. write its config in its module, e.g. :class:`jaxspec.causal.sps.Config` (SPS: draft length
   default 5, the draft model, ``needs = Needs(draft_family="causal", same_vocabulary=True)``,
   its :class:`~jaxspec.causal.sps.DraftModelDrafter`);
2. add one line to :data:`METHODS`: ``Method("sps", sps.Config, "one-line summary")``.

``scripts.generate`` (``--method``, ``--compare``, the options), ``scripts.benchmark`` (the
``jaxspec/<method>`` systems), ``scripts.evaluate`` and the registry-driven tests
(``tests/test_methods.py``) then take it without edits. Only an option no method had before needs
one more line: its flag in ``scripts.generate`` (``dest`` = the field name, default None).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from jaxspec.causal import dflash, sps
from jaxspec.causal.config import CausalConfig
from jaxspec.core.method_config import MethodConfig, Needs, flag
from jaxspec.core.results import DecodeResult
from jaxspec.methods.asarm import (
    AssdConfig,
    AssdFusedConfig,
    AssdFusedNgramConfig,
    AssdNgramConfig,
    SequentialConfig,
)
from jaxspec.methods.causal import DiffuSpecConfig, NgramConfig, SpaceConfig, SpecDiffConfig
from jaxspec.methods.dllm import (
    DEFAULT_GRAPH,
    DllmConfig,
    FixedKConfig,
    SpiffyMethodConfig,
    SSDMethodConfig,
    StepwiseConfig,
    ThresholdConfig,
    default_graph,
)

FAMILIES = ("causal", "dllm", "asarm")
FAMILY_WORDS = {"causal": "causal", "dllm": "masked-diffusion", "asarm": "any-order (XLNet AS-ARM)"}


class MethodError(ValueError):
    """Unknown method, a method used with the wrong model family, or options it does not
    take."""


@dataclasses.dataclass(frozen=True)
class Method:
    """One registry entry.

    Attributes:
      name: the ``--method`` value.
      config: its config class (a :class:`~jaxspec.core.method_config.MethodConfig`), which
        fixes the family, the reference, the needs, the decoder and the report.
      summary: one line for ``--help`` and the README.
      lossless: False for methods that are not lossless against any reference (fixed-k and
        threshold parallel decoding): ``--compare`` then reports a difference, not an error.
    """

    name: str
    config: type
    summary: str
    lossless: bool = True

    @property
    def family(self) -> str:
        """``"causal"``, ``"dllm"`` or ``"asarm"`` (:data:`FAMILIES`)."""
        return self.config.family

    @property
    def reference(self) -> str:
        """The method it is lossless against (its family's reference decoder; Spiffy's
        actual reference follows its settings, :meth:`MethodConfig.reference`)."""
        return self.config.reference_method

    @property
    def needs(self) -> Needs:
        return self.config.needs

    def options(self) -> tuple[str, ...]:
        """The option names :meth:`configure` takes."""
        return self.config.option_names()

    def configure(
        self, options: Optional[Mapping[str, Any]] = None, /, *, strict: bool = True, **kw
    ) -> MethodConfig:
        """The method's config of ``options`` and ``kw`` (``{option: value}``, option names
        as :meth:`options`; ``temperature`` / ``top_k`` / ``top_p`` or ``sampling``).

        Raises:
          MethodError: (``strict``) an option this method does not take, naming the methods
            that take it; ``ValueError`` / ``TypeError``: a value out of range (one line).
        """
        opts = {**(options or {}), **kw}
        if strict:
            mine = set(self.options()) | {"sampling"}
            for key in opts:
                if key not in mine:
                    raise MethodError(unused_option(self.name, key))
        return self.config.from_options(opts)

    def run(
        self,
        model,
        params,
        inputs,
        config: Optional[MethodConfig] = None,
        *,
        seed: int = 0,
        eos_ids: Sequence[int] = (),
        pad_id: int = 0,
    ) -> DecodeResult:
        """:func:`run` of this method."""
        return run(self, model, params, inputs, config, seed=seed, eos_ids=eos_ids, pad_id=pad_id)


def unused_option(name: str, key: str) -> str:
    """The one-line message for option ``key`` given to method ``name``, which does not take
    it: the methods of the same family that do (else the families whose methods do)."""
    family = METHODS[name].family if name in METHODS else None
    takers = [n for n, m in METHODS.items() if flag(key) in {flag(o) for o in m.options()}]
    same = [n for n in takers if METHODS[n].family == family]
    msg = f"{flag(key)} does not apply to --method {name}"
    if same:
        return f"{msg}; use --method {' / '.join(same)}"
    if takers:
        fams = dict.fromkeys(FAMILY_WORDS[METHODS[n].family] for n in takers)
        return (
            f"{msg} (a {FAMILY_WORDS[family]} method); it applies to the "
            f"{' and '.join(fams)} methods ({' / '.join(takers)})"
        )
    return msg


# ----------------------------------------------------------------------------- the table

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("ar", CausalConfig, "autoregressive decoding (the causal reference)"),
        Method("ngram", NgramConfig, "context n-gram drafts + chain verification"),
        Method("sps", sps.Config, "draft-model speculative sampling (a small causal LM drafts)"),
        Method(
            "space",
            SpaceConfig,
            "SPACE auto-correct decoding (a SAR-SFT model drafts in its own forward)",
        ),
        Method(
            "diffuspec",
            DiffuSpecConfig,
            "DiffuSpec: a diffusion LM drafts a block, CPS + ADL, point-mass verification",
        ),
        Method(
            "specdiff",
            SpecDiffConfig,
            "SpecDiff: a diffusion LM's argmax block, fixed length (DiffuSpec without CPS and ADL)",
        ),
        Method(
            "dflash",
            dflash.Config,
            "DFlash: a small block-diffusion drafter reading the target's hidden states",
        ),
        Method("stepwise", StepwiseConfig, "LLaDA/Dream stepwise unmasking (the dLLM reference)"),
        Method(
            "fixed-k", FixedKConfig, "fixed-k parallel unmasking (not lossless)", lossless=False
        ),
        Method(
            "threshold",
            ThresholdConfig,
            "Fast-dLLM confidence-threshold unmasking (not lossless)",
            lossless=False,
        ),
        Method("ssd", SSDMethodConfig, "SSD self-speculative decoding, hierarchical verification"),
        Method(
            "spiffy",
            SpiffyMethodConfig,
            "Spiffy draft graphs (lossless against the decoder "
            "it accelerates: stepwise, fixed-k or threshold)",
        ),
        Method(
            "sequential", SequentialConfig, "sequential any-order decoding (the AS-ARM reference)"
        ),
        Method("assd", AssdConfig, "ASSD Algorithm 1 (self-drafted)"),
        Method("assd-ngram", AssdNgramConfig, "ASSD Algorithm 2 (context bigram drafts)"),
        Method(
            "assd-fused",
            AssdFusedConfig,
            "fused ASSD: one AS-ARM call verifies the drafts "
            "and drafts the next ones (k+1 query groups)",
        ),
        Method(
            "assd-fused-ngram",
            AssdFusedNgramConfig,
            "fused ASSD with context bigram drafts (one call per iteration, bonus row)",
        ),
    )
}

DEFAULTS = {"causal": "ngram", "dllm": "stepwise", "asarm": "assd"}
"""The method a front end runs when none is named, per family."""


def get_method(name: Union[str, Method], family: Optional[str] = None) -> Method:
    """The registry entry ``name`` (a :class:`Method` is returned as it is).

    Raises:
      MethodError: unknown name, or a method of another family than ``family``.
    """
    if isinstance(name, Method):
        m = name
    elif name not in METHODS:
        raise MethodError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    else:
        m = METHODS[name]
    if family is not None and m.family != family:
        raise MethodError(
            f"method {m.name!r} needs a {m.family} model, but the model is "
            f"{family}; use --method {', '.join(methods_of(family))}"
        )
    return m


def methods_of(family: str) -> tuple[str, ...]:
    """Names of the methods of one family, in registry order."""
    return tuple(n for n, m in METHODS.items() if m.family == family)


def default_method(family: str, options: Mapping[str, Any] = ()) -> Method:
    """The method to run when none is named: the family's default (:data:`DEFAULTS`), or,
    when it does not take every option in ``options``, the first method of the family that
    does (a dLLM with ``threshold`` set runs ``threshold``)."""
    default = METHODS[DEFAULTS[family]]
    keys = set(options) - {"sampling"}
    if keys <= set(default.options()):
        return default
    fits = [METHODS[n] for n in methods_of(family) if keys <= set(METHODS[n].options())]
    return fits[0] if fits else default


def model_family(model) -> Optional[str]:
    """``"causal"``, ``"dllm"`` or ``"asarm"`` for the model classes of :mod:`models` (None
    for another object)."""
    from models.diffusion.modeling import DiffusionLM
    from models.llama.modeling import CausalLM
    from models.xlnet.modeling import XLNetLM

    for cls, fam in ((DiffusionLM, "dllm"), (XLNetLM, "asarm"), (CausalLM, "causal")):
        if isinstance(model, cls):
            return fam
    return None


def _is_id(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_row(what: str, row, i: int, kind=_is_id, expect: str = "int token ids") -> None:
    if isinstance(row, (str, bytes)):
        raise TypeError(
            f"{what} {i} is a {type(row).__name__}: {what}s must be {expect} "
            f"(tokenize text first, e.g. tokenizer.encode)"
        )
    if isinstance(row, np.ndarray) and row.ndim != 1:
        raise TypeError(f"{what} {i} is a {row.ndim}-d array, not a sequence of {expect}")
    try:
        vals = row.tolist() if isinstance(row, np.ndarray) else list(row)
    except TypeError:
        raise TypeError(
            f"{what} {i} is a {type(row).__name__}, not a sequence of {expect}"
        ) from None
    for v in vals:
        if not kind(v):
            raise TypeError(
                f"{what} {i} holds {v!r} ({type(v).__name__}): {what}s must be {expect}"
            )
    if not vals:
        raise ValueError(f"{what} {i} is empty")


def array_prompts(family: str, inputs):
    """Prompts given as one integer array ``(B, T)`` (numpy or JAX) as ``B`` lists of ids, the
    form every decoder takes; any other ``inputs`` (lists; AS-ARM tasks) come back unchanged.

    Raises:
      TypeError: an array of another rank or a non-integer dtype (one line naming its shape
        and dtype).
    """
    if family == "asarm" or not (hasattr(inputs, "ndim") and hasattr(inputs, "dtype")):
        return inputs
    arr = np.asarray(inputs)
    if arr.ndim != 2 or arr.dtype.kind not in "iu":
        hint = " (one prompt: pass ids[None])" if arr.ndim == 1 else ""
        raise TypeError(
            f"prompts given as an array must be int token ids of shape (B, T); got shape "
            f"{arr.shape}, dtype {arr.dtype}{hint}"
        )
    return arr.tolist()


def check_inputs(family: str, inputs) -> None:
    """``TypeError`` / ``ValueError`` (one line) unless ``inputs`` fit ``family``: prompts
    (a non-empty sequence of non-empty sequences of int token ids) for ``causal`` / ``dllm``,
    infilling tasks (pairs ``(int tokens, bool masked)`` of equal length) for ``asarm``."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, (Sequence, np.ndarray)):
        noun = "prompts" if family != "asarm" else "infilling tasks"
        raise TypeError(
            f"{noun} must be a list, one entry per row; got a "
            f"{type(inputs).__name__}"
            + (" (tokenize text first and pass [ids])" if isinstance(inputs, str) else "")
        )
    if len(inputs) == 0:
        raise ValueError("no inputs given: pass at least one row")
    if family != "asarm":
        if all(_is_id(x) for x in inputs):
            raise TypeError(
                "prompts must be a list of token-id lists (a batch); got one list "
                "of ids: pass [ids]"
            )
        for i, p in enumerate(inputs):
            _check_row("prompt", p, i)
        return
    for i, task in enumerate(inputs):
        if not isinstance(task, (tuple, list)) or len(task) != 2:
            raise TypeError(
                f"infilling task {i} must be a pair (tokens, masked), got {type(task).__name__}"
            )
        tokens, masked = task
        _check_row("task tokens", tokens, i)
        _check_row(
            "task mask",
            masked,
            i,
            lambda v: isinstance(v, (bool, np.bool_)),
            "bools (True: generate the position)",
        )
        if len(tokens) != len(masked):
            raise ValueError(
                f"infilling task {i}: {len(tokens)} tokens but {len(masked)} mask entries"
            )


def check_needs(method: Method, model, config: MethodConfig) -> None:
    """One-line ``ValueError`` when ``config`` lacks the draft model the method needs or the
    model lacks a [MASK] token it needs (:class:`~jaxspec.core.method_config.Needs`)."""
    needs = method.needs
    if needs.draft_family and getattr(config, needs.draft_field) is None:
        raise ValueError(
            f"method {method.name!r} needs a {FAMILY_WORDS[needs.draft_family]} draft model: "
            f"{needs.draft_field}=(model, params) (--draft-model NAME, e.g. {needs.example})"
        )
    if needs.mask_token and getattr(model.config, "mask_token_id", None) is None:
        raise ValueError(
            f"method {method.name!r} needs a SAR-SFT model with a [MASK] token "
            f"(e.g. --model {needs.example})"
        )


def run(
    method: Union[str, Method],
    model,
    params,
    inputs,
    config: Optional[MethodConfig] = None,
    *,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
) -> DecodeResult:
    """Run one method: the library's one decode call, the same for every method.

    Args:
      method: a registry name (:data:`METHODS`) or entry.
      model, params: the model (its family must be the method's) and its parameters.
      inputs: ``B`` prompts (lists of int token ids, or one int array ``(B, T)``; causal
        and dllm methods) or ``B`` infilling tasks ``(tokens, masked)`` (asarm methods).
      config: the method's config (:meth:`Method.configure` or its config class; None: the
        defaults).
      seed: PRNG seed; the same seed reproduces a run exactly.
      eos_ids: tokens that end a row (causal: the decode stops; dllm: the output is cut).
      pad_id: filler for left padding (never attended).

    Returns:
      a :class:`~jaxspec.core.results.DecodeResult`: ``tokens``, ``stats``, ``compile_s``,
      ``run_s`` (and the family's extras).

    Raises:
      MethodError: unknown method, or a model of another family ("ssd needs a dllm model
        (got a causal model)").
      TypeError: a config of another method; prompts that are not lists of int ids (a
        ``str``, float ids) or an array of prompts that is not 2-d int.
      ValueError: empty inputs, a missing draft model or [MASK] token, a draft length that
        does not fit the context, and every error of the decoder (one line).
    """
    m = get_method(method)
    fam = model_family(model)
    if fam is not None and fam != m.family:
        a = lambda f: "an" if f[0] in "aeiou" else "a"  # noqa: E731
        raise MethodError(
            f"{m.name} needs {a(m.family)} {m.family} model (got {a(fam)} {fam} model)"
        )
    if config is None:
        config = m.configure()
    if type(config) is not m.config:
        raise TypeError(
            f"method {m.name!r} takes a {m.config.__name__}, got "
            f"{type(config).__name__} (use get_method({m.name!r}).configure(...))"
        )
    inputs = array_prompts(m.family, inputs)
    check_inputs(m.family, inputs)
    check_needs(m, model, config)
    config.check_model(model, inputs)
    return config.decode(model, params, inputs, seed=seed, eos_ids=tuple(eos_ids), pad_id=pad_id)


def reference_of(method: Union[str, Method], config: MethodConfig) -> tuple[Method, MethodConfig]:
    """The reference run of ``config`` for ``--compare``: ``(entry, config)`` (Spiffy's
    reference is the decoder it accelerates, so its settings decide)."""
    name, ref = config.reference()
    return METHODS[name], ref


__all__ = [
    "METHODS",
    "FAMILIES",
    "FAMILY_WORDS",
    "DEFAULTS",
    "Method",
    "MethodError",
    "MethodConfig",
    "Needs",
    "get_method",
    "methods_of",
    "default_method",
    "run",
    "reference_of",
    "check_inputs",
    "model_family",
    "unused_option",
    "CausalConfig",
    "DllmConfig",
    "DEFAULT_GRAPH",
    "default_graph",
]
