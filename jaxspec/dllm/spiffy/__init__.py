"""Spiffy: lossless speculative decoding of masked-diffusion LMs with directed draft graphs.

Source: "Spiffy: Multiplying Diffusion LLM Acceleration via Lossless Speculative Decoding"
(Agrawal et al., arXiv:2509.18085; docs/methods/spiffy.md).

* :mod:`jaxspec.dllm.spiffy.graph`: draft graphs (Sec. 4.3, Eqs. 6-8): :class:`DraftGraph`,
  :func:`load_graph`, :func:`save_graph`, :func:`plot_graph` (Fig. 4).
* :mod:`jaxspec.dllm.spiffy.decode`: drafting (Eqs. 10-13), one-forward verification of the
  draft blocks (Sec. 4.2, Algorithm 1) and :func:`spiffy_generate`.
* :mod:`jaxspec.dllm.spiffy.calibrate`: offline calibration (Algorithm 2, Eqs. 24-28).
"""

from jaxspec.dllm.spiffy.calibrate import (
    STRATEGIES,
    CalibrationRecord,
    calibration_counts,
    candidate_graph,
    record_calibration,
    select_graph,
)
from jaxspec.dllm.spiffy.decode import (
    SpiffyConfig,
    draft_blocks,
    draft_ranks,
    run_spiffy,
    spiffy_generate,
)
from jaxspec.dllm.spiffy.graph import (
    DraftGraph,
    GraphError,
    formula_arrays,
    load_graph,
    plot_graph,
    save_graph,
)

__all__ = [
    "DraftGraph",
    "GraphError",
    "SpiffyConfig",
    "spiffy_generate",
    "load_graph",
    "save_graph",
    "draft_ranks",
    "draft_blocks",
    "record_calibration",
    "CalibrationRecord",
    "calibration_counts",
    "candidate_graph",
    "select_graph",
    "plot_graph",
    "STRATEGIES",
    "run_spiffy",
    "formula_arrays",
]
