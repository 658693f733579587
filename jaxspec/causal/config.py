"""Configs of the causal methods: :class:`CausalConfig` (autoregressive decoding, the
reference) and :class:`DraftedConfig`, the base of every speculative method that verifies a
drafter's proposals with :func:`jaxspec.causal.decode.generate`.

A speculative method subclasses :class:`DraftedConfig` with its knobs and
:meth:`DraftedConfig.drafter` (its :class:`jaxspec.core.drafters.Drafter`); e.g.
:class:`jaxspec.causal.sps.Config`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional, Union

from jaxspec.core.drafters import Drafter
from jaxspec.core.method_config import MAX_DRAFT_LENGTH, MethodConfig, check_int


def _context(model) -> int:
    return int(model.config.max_position_embeddings)


@dataclasses.dataclass(frozen=True)
class CausalConfig(MethodConfig):
    """Autoregressive decoding of a causal LM (the reference of every causal method).

    Attributes:
      sampling: the target distribution.
      max_new_tokens: generation budget per row (>= 1; prompt + budget must fit the context).
      plan: an explicit :class:`models.llama.layout.DecodePlan` (layer loop, weight layouts,
        gate cost; :func:`jaxspec.causal.decode.decode_plan`), or None: the decoder computes it
        once per model and batch. Not compared or hashed.

    Raises:
      ValueError: ``max_new_tokens < 1``.
    """

    max_new_tokens: int = 128
    plan: Any = dataclasses.field(default=None, compare=False)

    family: ClassVar[str] = "causal"
    reference_method: ClassVar[str] = "ar"

    def __post_init__(self):
        super().__post_init__()
        check_int("max_new_tokens", self.max_new_tokens, 1)

    def reference(self) -> tuple[str, "CausalConfig"]:
        return "ar", CausalConfig(sampling=self.sampling, max_new_tokens=self.max_new_tokens)

    # the speculative hooks; AR has no drafter
    def drafter(self, target_config) -> Optional[Drafter]:
        """The drafter for a target of config ``target_config`` (None: AR decoding)."""
        return None

    def drafter_params(self, target_params: Any = None) -> Any:
        """The drafter's parameters (a traced argument of the decode loop; ``()``: none).
        ``target_params``: the target's parameters, for a drafter that shares some of them
        (DFlash: the embedding and LM head); the others ignore them."""
        return ()

    def adapter(self):
        """``(target tokenizer, drafter tokenizer)`` for a drafter of another vocabulary
        (:mod:`jaxspec.causal.hetero`), else None."""
        return None

    def decode(self, model, params, prompts, *, seed: int = 0, eos_ids=(), pad_id: int = 0):
        """Decode ``prompts`` (validated by :func:`jaxspec.methods.run`): AR without a
        drafter, else speculative decoding with :meth:`drafter` through
        :func:`jaxspec.causal.decode.generate` (a drafter of another vocabulary through
        :func:`jaxspec.causal.hetero.hetero_generate`). Returns a
        :class:`~jaxspec.causal.decode.GenerationResult`."""
        from jaxspec.causal.decode import generate
        from jaxspec.causal.hetero import hetero_generate

        drafter = self.drafter(model.config)
        if self.adapter() is not None:
            target_tok, drafter_tok = self.adapter()
            return hetero_generate(
                model,
                params,
                prompts,
                drafter=drafter,
                drafter_params=self.drafter_params(params),
                target_tokenizer=target_tok,
                drafter_tokenizer=drafter_tok,
                max_new_tokens=self.max_new_tokens,
                sampling=self.sampling,
                seed=seed,
                eos_ids=eos_ids,
                pad_id=pad_id,
            )
        return generate(
            model,
            params,
            prompts,
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            drafter=drafter,
            drafter_params=self.drafter_params(params),
            seed=seed,
            eos_ids=eos_ids,
            pad_id=pad_id,
            gate=self.gate_cost if self.plan is None else "off",
            plan=self.plan,
        )

    @property
    def gate_cost(self) -> Union[str, float]:
        """The cost gate handed to :func:`jaxspec.causal.decode.generate`."""
        return "off"

    def report(self, label: str, result) -> list[str]:
        lines = super().report(label, result)
        lines[0] += tuning_note(getattr(result, "settings", {}) or {})
        return lines


def tuning_note(settings: dict) -> str:
    """The per-machine choices of a speculative decode for its stats line (verification
    layout, the layout of its one-token steps, gate cost)."""
    out = f" verify-layout={settings['verify_layout']}" if "verify_layout" in settings else ""
    if settings.get("step_layout", settings.get("verify_layout")) != settings.get("verify_layout"):
        out += f" step-layout={settings['step_layout']}"
    if "verify_cost" in settings:
        out += f" gate-cost={settings['verify_cost']:.2f}"
    return out


def parse_gate(gate) -> Union[str, float]:
    """``"off"``, ``"auto"`` or a verification pass cost >= 1 in one-token steps (a number or
    its text). Raises a one-line ``ValueError`` otherwise."""
    g = gate
    if isinstance(g, str) and g not in ("auto", "off"):
        try:
            g = float(g)
        except ValueError:
            raise ValueError(
                f"unknown --gate {gate!r}; expected auto, off or a verification "
                "pass cost >= 1 (one-token steps)"
            ) from None
    if not isinstance(g, str) and not g >= 1.0:
        raise ValueError(f"--gate must be >= 1 (one-token steps), got {g}")
    return g


@dataclasses.dataclass(frozen=True)
class DraftedConfig(CausalConfig):
    """Base of the speculative causal methods: a drafter proposes ``draft_length`` tokens,
    the target verifies them in one pass (lossless against AR).

    Attributes:
      draft_length: k, draft tokens per step (1..:data:`MAX_DRAFT_LENGTH`; with the prompt
        and the budget it must fit the model's context, :meth:`check_model`). ``None`` takes
        the method's :attr:`default_draft_length`.
      gate: verify drafts only while their expected accepted length pays for the pass
        (:func:`jaxspec.causal.decode.tune_verification`): ``"off"``, ``"auto"`` or the cost
        of a verification pass in one-token steps (>= 1). Lossless either way.
    """

    draft_length: Optional[int] = None
    gate: Union[str, float] = "off"

    default_draft_length: ClassVar[int] = 8

    def __post_init__(self):
        super().__post_init__()
        if self.draft_length is None:
            object.__setattr__(self, "draft_length", self.default_draft_length)
        check_int("draft_length", self.draft_length, 1, MAX_DRAFT_LENGTH)
        object.__setattr__(self, "gate", parse_gate(self.gate))

    @property
    def k(self) -> int:
        return int(self.draft_length)

    @property
    def gate_cost(self) -> Union[str, float]:
        return self.gate

    def check_model(self, model, inputs) -> None:
        ctx = _context(model)
        longest = max((len(p) for p in inputs), default=0)
        room = ctx - longest - self.max_new_tokens
        if self.k > room >= 1:
            raise ValueError(
                f"--draft-length {self.k} does not fit: prompt of {longest} tokens + "
                f"{self.max_new_tokens} new tokens + {self.k} draft positions exceeds the "
                f"model's context of {ctx} tokens (allowed --draft-length 1..{room})"
            )


def check_ngram_range(max_ngram, min_ngram) -> None:
    """One-line error unless ``1 <= min_ngram <= max_ngram`` (the suffix lengths a context
    n-gram lookup tries: :class:`jaxspec.core.drafters.NgramDrafter`)."""
    check_int("min_ngram", min_ngram, 1)
    check_int("max_ngram", max_ngram, 1)
    if min_ngram > max_ngram:
        raise ValueError(
            f"--min-ngram {min_ngram} exceeds --max-ngram {max_ngram}; "
            "need 1 <= --min-ngram <= --max-ngram"
        )


__all__ = ["CausalConfig", "DraftedConfig", "check_ngram_range", "parse_gate", "tuning_note"]
