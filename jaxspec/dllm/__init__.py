"""Masked-diffusion LM decoding (LLaDA / Dream): the stepwise reference and two lossless
speculative decoders built on it.

Modules (imports run downwards only; everything here depends on :mod:`jaxspec.core` and
:mod:`models` alone):

* :mod:`~jaxspec.dllm.config`: :class:`DiffusionDecodeConfig`, :class:`DiffusionResult`,
  :func:`prepare_batch` (request checks, bucketed left padding).
* :mod:`~jaxspec.dllm.reference`: the reference step in pieces (processed logits, confidence,
  transfer rank and rule, noise), callable outside any loop.
* :mod:`~jaxspec.dllm.blocks`: layout, block windows, the lockstep block advance, Fast-dLLM
  caches, counters.
* :mod:`~jaxspec.dllm.nodes`: the batched candidate-node forwards of SSD and Spiffy and their
  multi-device layout.
* :mod:`~jaxspec.dllm.decode`: :func:`diffusion_generate` (stepwise / fixed-k / threshold,
  prefix / dual caches).
* :mod:`~jaxspec.dllm.ssd`: SSD, :func:`ssd_generate`.
* :mod:`~jaxspec.dllm.spiffy`: Spiffy, :func:`spiffy_generate`, draft graphs, calibration.
"""

from jaxspec.dllm.blocks import MAX_PREFIX_WIDTHS, prefix_widths
from jaxspec.dllm.config import (
    CACHES,
    REMASKING,
    DiffusionDecodeConfig,
    DiffusionResult,
    prepare_batch,
)
from jaxspec.dllm.decode import diffusion_generate
from jaxspec.dllm.nodes import draft_mesh, shard_params
from jaxspec.dllm.reference import (
    Knobs,
    Rule,
    block_confidence,
    num_transfer_tokens,
    origin_probs,
    processed_logits,
    reference_step,
    row_noise,
    score_block,
    step_noise,
    transfer_rank,
    transfer_rule,
    transfer_schedule,
)
from jaxspec.dllm.spiffy import (
    STRATEGIES,
    CalibrationRecord,
    DraftGraph,
    GraphError,
    SpiffyConfig,
    calibration_counts,
    load_graph,
    plot_graph,
    record_calibration,
    save_graph,
    select_graph,
    spiffy_generate,
)
from jaxspec.dllm.ssd import TREES, SSDConfig, acceptance_limit, ssd_generate, stepwise_topk

__all__ = [
    "DiffusionDecodeConfig",
    "DiffusionResult",
    "diffusion_generate",
    "prepare_batch",
    "REMASKING",
    "CACHES",
    "MAX_PREFIX_WIDTHS",
    "prefix_widths",
    "Knobs",
    "Rule",
    "num_transfer_tokens",
    "origin_probs",
    "transfer_schedule",
    "row_noise",
    "step_noise",
    "processed_logits",
    "block_confidence",
    "transfer_rank",
    "score_block",
    "transfer_rule",
    "reference_step",
    "SSDConfig",
    "TREES",
    "ssd_generate",
    "stepwise_topk",
    "acceptance_limit",
    "draft_mesh",
    "shard_params",
    "SpiffyConfig",
    "DraftGraph",
    "GraphError",
    "load_graph",
    "save_graph",
    "plot_graph",
    "spiffy_generate",
    "record_calibration",
    "CalibrationRecord",
    "calibration_counts",
    "select_graph",
    "STRATEGIES",
]
