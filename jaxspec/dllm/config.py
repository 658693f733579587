"""What a masked-diffusion decode request is and what comes back, for every decoder of
:mod:`jaxspec.dllm` (the stepwise / fixed-k / threshold reference, SSD and Spiffy).

* :class:`DiffusionDecodeConfig`: the reference decoding rule (blocks, steps, remasking,
  temperature, caches, ...), frozen and hashable.
* :func:`structural`: the config with its numeric knobs replaced by placeholders, i.e. only
  what changes the compiled program; the numbers travel traced in
  :class:`jaxspec.dllm.reference.Knobs`, so sweeping them reuses one executable.
* :func:`prepare_batch`: request checks and bucketed left padding (one layout for all).
* :class:`DiffusionResult` and :func:`diffusion_result`: the tokens, transfer order and the
  :class:`~jaxspec.core.stats.DecodeStats` record every decoder returns.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from jaxspec.core.batching import check_prompts, cut_after_eos, left_pad
from jaxspec.core.results import DecodeResult
from jaxspec.core.stats import DecodeStats
from models.diffusion.modeling import DiffusionLM

REMASKING = ("low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy")
CACHES = ("none", "prefix", "dual")
CONFIDENCE_SOFTMAX = ("official", "renormalized")
BLOCK_STARTS = ("rule", "first-position")


@dataclasses.dataclass(frozen=True)
class DiffusionDecodeConfig:
    """How to decode a masked-diffusion LM (frozen, hashable: a static jit argument).

    Attributes:
      gen_length: ``G``, the number of generated positions (all start masked).
      block_length: ``L``, the semi-autoregressive block size; ``G % L == 0``.
        ``L == G`` is a single block (no semi-AR).
      steps: total steps for the stepwise schedule (``"stepwise"`` method); must be
        divisible by ``num_blocks``. Ignored by fixed-k and threshold decoding.
      remasking: which masked positions to transfer: one of :data:`REMASKING`
        (``"low_confidence"``/``"random"``: LLaDA; the others: Dream's rule names).
      temperature: 0 = arg-max; > 0 samples ``x0`` from ``softmax(logits / T)`` (Gumbel-max).
      cfg_scale: classifier-free guidance scale (0 = off).
      tokens_per_step: fixed-k parallel decoding (``None`` = off).
      threshold: Fast-dLLM confidence-threshold parallel decoding (``None`` = off).
      mask_id: override of the model's ``mask_token_id`` (``None`` = the model's).
      eps: Dream's final time for ``"origin"`` (time grid ``linspace(1, eps, steps + 1)``).
      logits_eos_inf: never generate an id of ``eos_ids`` (LLaDA option; see
        :mod:`jaxspec.dllm.decode`).
      confidence_eos_eot_inf: transfer predicted ``eos_ids`` last (LLaDA option).
      schedule: stepwise transfer counts: ``"llada"`` (``get_num_transfer_tokens``) or
        ``"dream"`` (``int(n_masked * (1 - s/t))``, the rest at the last step).
      cache: ``"none"``, ``"prefix"`` or ``"dual"`` (Fast-dLLM KV caches).
      top_k: keep the ``top_k`` most likely tokens before sampling (0 = off).
      top_p: nucleus filter before sampling (1.0 = off), in ``(0, 1]``.
      confidence_softmax: the softmax that scores confidence: ``"official"`` (default) keeps
        the [MASK] logit in it, as LLaDA ``generate.py``, Fast-dLLM ``get_transfer_index`` and
        Dream ``sample_tokens`` compute it; ``"renormalized"`` (jaxspec's earlier rule) sets
        the [MASK] logit to -inf first, so a confidence is ``p / (1 - p_mask)``. Either way
        the predicted token ``x0`` is never [MASK] (the official code could predict it and
        "transfer" a mask; jaxspec excludes it).
      alg_temp: Dream's ``alg_temp``: > 0 draws the transferred positions from
        ``softmax(confidence / alg_temp)`` instead of taking the most confident (stepwise and
        fixed-k only; 0 = off).
      block_start: what a block's first step transfers: ``"rule"`` (default) applies the
        decoding rule there as at every step; ``"first-position"`` transfers exactly the
        block's first position, whatever its confidence, and the rule decides from the
        second step on: Fast-dLLM's Dream block decoder (NVlabs/Fast-dLLM
        ``dream/model/generation_utils_block.py``, ``_sample``: the block's full forward
        writes ``x0`` at ``current_block_start`` only). With the Dream schedule the counts
        then use the time grid from its second point on, as that decoder's non-threshold
        branch does. Threshold decoding, or stepwise with ``schedule="dream"``, only.

    Raises:
      ValueError: non-positive lengths/steps, ``gen_length % block_length != 0``, ``steps``
        not divisible by the number of blocks (stepwise), unknown ``remasking``, negative
        temperature or cfg scale, ``tokens_per_step < 1``, both ``tokens_per_step`` and
        ``threshold`` set, a non-finite threshold, ``"origin"`` with parallel decoding,
        an unknown ``cache``, ``top_k < 0``, ``top_p`` outside ``(0, 1]``, a negative
        ``alg_temp``, ``alg_temp`` with ``threshold`` / ``"origin"`` / ``"random"``, an
        unknown ``block_start``, or ``"first-position"`` outside threshold / Dream-schedule
        stepwise decoding (or with ``"origin"``).
    """

    gen_length: int = 16
    block_length: int = 16
    steps: int = 16
    remasking: str = "low_confidence"
    temperature: float = 0.0
    cfg_scale: float = 0.0
    tokens_per_step: Optional[int] = None
    threshold: Optional[float] = None
    mask_id: Optional[int] = None
    eps: float = 1e-3
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    schedule: str = "llada"
    cache: str = "none"
    top_k: int = 0
    top_p: float = 1.0
    alg_temp: float = 0.0
    confidence_softmax: str = "official"
    block_start: str = "rule"

    def __post_init__(self):
        self._check_options()
        self._check_lengths()

    def _check_options(self):
        if self.cache not in CACHES:
            raise ValueError(f"unknown cache {self.cache!r}; expected one of {', '.join(CACHES)}")
        if self.confidence_softmax not in CONFIDENCE_SOFTMAX:
            raise ValueError(
                f"unknown confidence_softmax {self.confidence_softmax!r}; expected "
                f"one of {', '.join(CONFIDENCE_SOFTMAX)}"
            )
        if self.block_start not in BLOCK_STARTS:
            raise ValueError(
                f"unknown block_start {self.block_start!r}; expected one of "
                f"{', '.join(BLOCK_STARTS)}"
            )
        if self.block_start == "first-position" and (
            self.remasking == "origin"
            or self.tokens_per_step is not None
            or (self.threshold is None and self.schedule != "dream")
        ):
            raise ValueError(
                "block_start 'first-position' is Fast-dLLM's Dream block rule: it needs "
                "threshold decoding or stepwise decoding with schedule 'dream' (not fixed-k "
                "or 'origin')"
            )
        if int(self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if not self.alg_temp >= 0.0:
            raise ValueError(f"alg_temp must be >= 0, got {self.alg_temp}")
        if self.alg_temp > 0 and (
            self.threshold is not None or self.remasking in ("origin", "random")
        ):
            raise ValueError(
                "alg_temp samples positions by confidence; it works with stepwise "
                "or fixed-k decoding and a confidence rule (not threshold, "
                "'origin' or 'random')"
            )

    def _check_lengths(self):
        if self.gen_length < 1 or self.block_length < 1:
            raise ValueError(
                f"gen_length and block_length must be >= 1, got "
                f"{self.gen_length} and {self.block_length}"
            )
        if self.gen_length % self.block_length:
            raise ValueError(
                f"gen_length {self.gen_length} is not a multiple of block_length "
                f"{self.block_length}"
            )
        if self.schedule not in ("llada", "dream"):
            raise ValueError(f"unknown schedule {self.schedule!r}; expected 'llada' or 'dream'")
        if self.remasking not in REMASKING:
            raise ValueError(
                f"unknown remasking {self.remasking!r}; expected one of {', '.join(REMASKING)}"
            )
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not self.cfg_scale >= 0.0:
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        if self.tokens_per_step is not None and self.threshold is not None:
            raise ValueError("tokens_per_step and threshold are exclusive; set at most one")
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be >= 1, got {self.tokens_per_step}")
        if self.threshold is not None and not np.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {self.threshold}")
        if self.method == "stepwise":
            if self.steps < 1:
                raise ValueError(f"steps must be >= 1, got {self.steps}")
            if self.steps % self.num_blocks:
                raise ValueError(
                    f"steps {self.steps} is not divisible by the number of blocks "
                    f"{self.num_blocks} (gen_length / block_length)"
                )
        elif self.remasking == "origin":
            raise ValueError(
                "remasking 'origin' has its own random transfer count; it only "
                "works with stepwise decoding (no tokens_per_step / threshold)"
            )

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    @property
    def method(self) -> str:
        """``"stepwise"``, ``"fixed-k"`` or ``"threshold"`` (the stats' method name)."""
        if self.tokens_per_step is not None:
            return "fixed-k"
        if self.threshold is not None:
            return "threshold"
        return "stepwise"


def structural(cfg: DiffusionDecodeConfig) -> DiffusionDecodeConfig:
    """``cfg`` with its numeric knobs replaced by placeholders that keep only what changes
    the compiled program (whether temperature / CFG / alg_temp are on, which method); the
    values travel traced in :class:`jaxspec.dllm.reference.Knobs`."""
    return dataclasses.replace(
        cfg,
        temperature=1.0 if cfg.temperature > 0 else 0.0,
        cfg_scale=1.0 if cfg.cfg_scale > 0 else 0.0,
        threshold=None if cfg.threshold is None else 0.0,
        tokens_per_step=None if cfg.tokens_per_step is None else 1,
        eps=1e-3,
        mask_id=None,
        alg_temp=1.0 if cfg.alg_temp > 0 else 0.0,
    )


def eos_statics(cfg: DiffusionDecodeConfig, eos_ids: Sequence[int]) -> tuple[int, ...]:
    """The EOS ids the compiled loop needs (sorted, deduplicated): ``eos_ids`` when an EOS
    option is on, else ``()`` (the loop never looks at EOS; the host cuts after it)."""
    if cfg.logits_eos_inf or cfg.confidence_eos_eot_inf:
        return tuple(sorted({int(e) for e in eos_ids}))
    return ()


def prepare_batch(
    model: DiffusionLM,
    prompts: Sequence[Sequence[int]],
    cfg: DiffusionDecodeConfig,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 16,
    max_context: Optional[int] = None,
):
    """Check a decode request and left-pad the prompts (shared by every diffusion decoder).

    Returns:
      ``(buf int32 (B, P), pad int32 (B,), mask_id)``: prompts left-padded with ``pad_id``
      to ``P`` (a multiple of ``bucket``), the padding count per row, the mask token id.

    Raises:
      ValueError: mask id or ``eos_ids`` outside the vocabulary, an EOS option without
        ``eos_ids``, no prompts or an empty prompt, prompt token ids outside the vocabulary
        (:class:`jaxspec.core.batching.DecodeInputError`), or padded prompt + ``gen_length``
        longer than the context.
    """
    base = model.config.base
    V = base.vocab_size
    mask_id = model.config.mask_token_id if cfg.mask_id is None else int(cfg.mask_id)
    if not 0 <= mask_id < V:
        raise ValueError(f"mask id {mask_id} is outside the vocabulary [0, {V})")
    if (cfg.logits_eos_inf or cfg.confidence_eos_eot_inf) and not eos_ids:
        raise ValueError("logits_eos_inf / confidence_eos_eot_inf need eos_ids")
    if any(not 0 <= int(e) < V for e in eos_ids):
        raise ValueError(f"eos_ids must lie in [0, {V})")
    lens = check_prompts(prompts, V)
    buf, pad = left_pad(prompts, bucket, pad_id)
    P = buf.shape[1]
    ctx = max_context or base.max_position_embeddings
    if max(lens) + cfg.gen_length > ctx or P + cfg.gen_length > ctx:
        raise ValueError(
            f"prompt ({max(lens)} tokens, padded to {P}) + gen_length "
            f"{cfg.gen_length} exceeds the context of {ctx} tokens"
        )
    return buf, pad, mask_id


@dataclasses.dataclass
class DiffusionResult(DecodeResult):
    """Output of :func:`jaxspec.dllm.decode.diffusion_generate` (and of SSD and Spiffy).

    Attributes:
      tokens: per row, the generated ids cut after the first EOS (kept).
      full_tokens: int32 ``(B, G)`` every generated position (no cut).
      transfer_step: int32 ``(B, G)``: the 0-based step (of that row) at which each
        generation position was unmasked; the transfer order.
      stats: :class:`jaxspec.core.stats.DecodeStats` (``target_nfe`` = forwards, ``steps``,
        ``accept_hist[b, j]`` = steps of row ``b`` that transferred ``j`` tokens,
        ``draft_length`` 0, reference ``"stepwise"``).
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself.
      steps_by_nfe: int32 ``(B, T)`` (SSD and Spiffy; None for the reference decoders, whose
        forward ``i`` is step ``i``): reference steps taken after each forward of the row
        (cumulative), so forward ``i`` committed the positions whose ``transfer_step`` lies in
        ``[steps_by_nfe[i - 1], steps_by_nfe[i])``.
    """

    tokens: list[list[int]]
    full_tokens: np.ndarray
    transfer_step: np.ndarray
    stats: DecodeStats
    compile_s: float
    run_s: float
    steps_by_nfe: Optional[np.ndarray] = None


def diffusion_result(
    tokens: np.ndarray,
    transfer_step: np.ndarray,
    eos_ids: Sequence[int],
    cfg: DiffusionDecodeConfig,
    compile_s: float,
    run_s: float,
    *,
    method: str,
    reference: str,
    target_nfe: np.ndarray,
    steps: np.ndarray,
    accept_hist: np.ndarray,
    draft_length: int,
    drafts_proposed: np.ndarray,
    forward_tokens: np.ndarray,
    extra: dict,
    steps_by_nfe: Optional[np.ndarray] = None,
) -> DiffusionResult:
    """Assemble a :class:`DiffusionResult` on the host: rows cut after their first EOS, the
    stats record with the extras every diffusion decoder reports (``remasking``,
    ``gen_length``, ``block_length``, ``cache``, ``forward_tokens``) plus ``extra``.

    Args: numpy ``tokens``/``transfer_step`` int32 ``(B, G)``; per-row int counters ``(B,)``
    and ``accept_hist`` ``(B, bins)`` as the loop left them."""
    rows = cut_after_eos(tokens, eos_ids)
    stats = DecodeStats(
        method=method,
        reference=reference,
        target_nfe=target_nfe,
        draft_nfe=np.zeros_like(target_nfe),
        steps=steps,
        accept_hist=accept_hist,
        new_tokens=np.array([len(r) for r in rows]),
        draft_length=draft_length,
        drafts_proposed=drafts_proposed,
        extra={
            "remasking": cfg.remasking,
            "gen_length": cfg.gen_length,
            "block_length": cfg.block_length,
            "cache": cfg.cache,
            "forward_tokens": int(forward_tokens.sum()),
            **extra,
        },
    )
    return DiffusionResult(
        tokens=rows,
        full_tokens=tokens,
        transfer_step=transfer_step,
        stats=stats,
        compile_s=compile_s,
        run_s=run_s,
        steps_by_nfe=steps_by_nfe,
    )


__all__ = [
    "DiffusionDecodeConfig",
    "DiffusionResult",
    "REMASKING",
    "CACHES",
    "structural",
    "eos_statics",
    "prepare_batch",
    "diffusion_result",
]
