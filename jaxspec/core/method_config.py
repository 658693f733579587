"""The base of every method's typed config (:class:`MethodConfig`) and what a method needs
besides its target model (:class:`Needs`).

A method's config is a frozen dataclass: its fields are the method's knobs, named as the
``scripts.generate`` options that set them (``draft_length`` is ``--draft-length``), plus one
:class:`~jaxspec.core.sampling.SamplingConfig` (``--temperature``, ``--top-k``, ``--top-p``
reach the sampler through it and nowhere else). Construction validates every field and
raises a one-line ``ValueError`` naming the option, its value and the allowed range; bounds
that depend on the model (draft length against the context, a [MASK] token) are checked by
:meth:`MethodConfig.check_model` once the model is known and before anything compiles.
:meth:`MethodConfig.from_options` builds a config from ``{option: value}`` (the command line).
The registry (:mod:`jaxspec.methods`) pairs a config class with its decoder.

Design after gemma's ``Sampler`` / ``SamplingMethod`` (google-deepmind/gemma,
``gm/text/_sampler.py``, ``_sampling.py``): the sampling rule is one small frozen object
handed to the decoder, not a set of loose arguments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping, Optional

from jaxspec.core.sampling import SamplingConfig

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p")
"""Options that build the config's :class:`SamplingConfig`."""

MAX_DRAFT_LENGTH = 1024
"""Largest draft length a config accepts before the model is known. A verification pass
scores ``k + 1`` positions (``(B, k + 1, V)`` float32 logits: 0.6 GB per row at ``k = 1024``
and Qwen2's 152k vocabulary) and keeps ``k`` more key / value slots; the papers use
``k <= 30`` (DiffuSpec's ``k_max``). :meth:`MethodConfig.check_model` then bounds ``k`` by
the model's context."""

FLAGS = {
    "cps": "--no-cps",
    "adl": "--no-adl",
    "dllm_drafter": "--draft-model",
    "drafter_model": "--dflash-drafter",
    "draft_vocab": "--dflash-draft-vocab",
    "suppress": "--suppress-unk",
}
"""Command-line spelling of the fields whose flag is not ``--`` + the name with dashes."""


def flag(name: str) -> str:
    """The command-line option that sets config field ``name`` (``draft_length`` ->
    ``--draft-length``)."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


@dataclasses.dataclass(frozen=True)
class Needs:
    """What a method needs besides the target model, declared as data so that a front end
    can check it before any model loads.

    Attributes:
      draft_family: the family of the draft model it takes (``"causal"`` or ``"dllm"``;
        None: no draft model). The loaded ``(model, params)`` pair goes in the config field
        ``draft_field``.
      draft_field: the config field holding the draft model.
      same_vocabulary: the draft model must share the target's tokenizer.
      mask_token: the target model must have a [MASK] token (a SAR-SFT model).
      example: an example ``--model`` / ``--draft-model`` for the error messages.
    """

    draft_family: Optional[str] = None
    draft_field: str = "draft_model"
    same_vocabulary: bool = False
    mask_token: bool = False
    example: str = ""


def check_int(name: str, value, low: int, high: Optional[int] = None) -> None:
    """One-line ``ValueError`` unless ``value`` is an int in ``[low, high]`` (``TypeError``
    for a non-integer). ``name`` is the config field."""
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise TypeError(f"{flag(name)} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{flag(name)} must be {allowed}, got {value}")


def check_float(name: str, value, low: float, high: float, *, low_open: bool = False) -> None:
    """One-line ``ValueError`` unless ``value`` is a finite number in ``[low, high]``
    (``(low, high]`` with ``low_open``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not hasattr(value, "__float__")
    ):
        raise TypeError(f"{flag(name)} must be a number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and v <= high
    if not ok:
        rng = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{flag(name)} must lie in {rng}, got {value}")


def check_choice(name: str, value, choices) -> None:
    """One-line ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(
            f"unknown {flag(name)} {value!r}; expected one of {', '.join(map(str, choices))}"
        )


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    """Base of every method's config (module docstring).

    Attributes:
      sampling: the target distribution (temperature 0 = greedy).

    Class attributes (set by subclasses):
      family: ``"causal"``, ``"dllm"`` or ``"asarm"``: the model family it decodes.
      needs: :class:`Needs`.
      reference_method: the registry name of the method this one is lossless against.
      replays_samples: sampled runs draw the same tokens as the reference (the masked-
        diffusion decoders replay its noise), so a sampled ``--compare`` expects identity.
    """

    sampling: SamplingConfig = SamplingConfig()

    family: ClassVar[str] = ""
    needs: ClassVar[Needs] = Needs()
    reference_method: ClassVar[str] = ""
    replays_samples: ClassVar[bool] = False

    def __post_init__(self):
        if not isinstance(self.sampling, SamplingConfig):
            raise TypeError(
                f"sampling must be a jaxspec.core.sampling.SamplingConfig, got "
                f"{type(self.sampling).__name__}"
            )

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The options :meth:`from_options` reads: the fields (``sampling`` as its three
        options)."""
        names = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "sampling"]
        return SAMPLING_OPTIONS + tuple(names)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]):
        """The config of ``options`` (``{field or sampling option: value}``); options it does
        not read are ignored (:meth:`jaxspec.methods.Method.configure` rejects them)."""
        opts = dict(options)
        kw = {
            f.name: opts[f.name]
            for f in dataclasses.fields(cls)
            if f.init and f.name in opts and f.name != "sampling"
        }
        samp = {k: opts[k] for k in SAMPLING_OPTIONS if k in opts}
        if "sampling" in opts and samp:
            raise ValueError("give either sampling or temperature / top_k / top_p, not both")
        if "sampling" in opts:
            kw["sampling"] = opts["sampling"]
        elif samp:
            kw["sampling"] = SamplingConfig(**samp)
        return cls(**kw)

    # ------------------------------------------------------------------ overridden per method
    @property
    def lossless(self) -> bool:
        """Whether this config's output is lossless against :meth:`reference`."""
        return True

    def reference(self) -> tuple[str, "MethodConfig"]:
        """``(method name, config)`` of the run this one is lossless against (the run
        ``scripts.generate --compare`` makes); a reference decoder returns itself."""
        raise NotImplementedError

    def decode(self, model, params, inputs, *, seed: int = 0, eos_ids=(), pad_id: int = 0):
        """Decode ``inputs`` (prompts, or infilling tasks for AS-ARMs) with this config;
        returns a :class:`jaxspec.core.results.DecodeResult`. Called by
        :func:`jaxspec.methods.run` after its checks."""
        raise NotImplementedError

    def check_model(self, model, inputs) -> None:
        """Bounds that depend on the model and the inputs, checked before anything compiles
        (one-line ``ValueError``); the base checks nothing."""

    def describe(self) -> str:
        """Settings worth naming next to the method in a comparison line (may be empty)."""
        return ""

    def report(self, label: str, result) -> list[str]:
        """The stats lines of ``result`` (``[label] ...``; the first line is the summary)."""
        s = result.stats
        return [
            f"[{label}] tokens={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"MAT={s.mat:.2f} acceptance={acceptance(s)} "
            f"tokens/s={result.tokens_per_s:.1f} run={result.run_s:.2f}s "
            f"compile={result.compile_s:.1f}s"
        ]


def acceptance(stats) -> str:
    """The acceptance rate for a stats line: ``-`` for a decoder that drafts nothing, ``n/a``
    when no draft reached verification."""
    if stats.draft_length == 0:
        return "-"
    rate = stats.acceptance_rate
    return "n/a" if math.isnan(rate) else f"{rate:.3f}"


__all__ = [
    "MethodConfig",
    "Needs",
    "flag",
    "check_int",
    "check_float",
    "check_choice",
    "acceptance",
    "MAX_DRAFT_LENGTH",
    "SAMPLING_OPTIONS",
]
