"""jaxspec: lossless speculative decoding for causal, masked-diffusion and any-order LMs.

The public API: :func:`run` (``run(method, model, params, inputs, config, *, seed)``, the
same for every method; :mod:`jaxspec.methods` is the registry the command-line tools use and
documents how to add a method), and below it one generate function and config per decoder:

=====================  ==========================================  ==========================
method                 call                                        lossless against
=====================  ==========================================  ==========================
AR / n-gram / drafts   :func:`generate` (``drafter=``)              AR
stepwise / fixed-k /   :func:`diffusion_generate`                  (the dLLM reference)
threshold              (:class:`DiffusionDecodeConfig`)
SSD                    :func:`ssd_generate` (:class:`SSDConfig`)    one-token-per-step stepwise
Spiffy                 :func:`spiffy_generate`                      the decoder it accelerates
                       (:class:`SpiffyConfig`, :class:`DraftGraph`)
ASSD                   :func:`assd_generate`                        sequential any-order
=====================  ==========================================  ==========================
"""

from jaxspec.asarm.assd import assd_generate
from jaxspec.causal.decode import DecodeInputError, GenerationResult, generate
from jaxspec.core.drafters import Draft, DraftContext, Drafter, NgramDrafter
from jaxspec.core.results import DecodeResult
from jaxspec.core.sampling import SamplingConfig
from jaxspec.core.stats import DecodeStats
from jaxspec.dllm import (
    DiffusionDecodeConfig,
    DiffusionResult,
    DraftGraph,
    SpiffyConfig,
    SSDConfig,
    diffusion_generate,
    load_graph,
    spiffy_generate,
    ssd_generate,
)
from jaxspec.methods import METHODS, Method, MethodError, get_method, run

__all__ = [
    "generate",
    "GenerationResult",
    "DecodeInputError",
    "SamplingConfig",
    "DecodeStats",
    "Drafter",
    "Draft",
    "DraftContext",
    "NgramDrafter",
    "DiffusionDecodeConfig",
    "DiffusionResult",
    "diffusion_generate",
    "SSDConfig",
    "ssd_generate",
    "SpiffyConfig",
    "DraftGraph",
    "load_graph",
    "spiffy_generate",
    "assd_generate",
    "METHODS",
    "Method",
    "MethodError",
    "get_method",
    "run",
    "DecodeResult",
]
