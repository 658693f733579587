"""Any-subset autoregressive (AS-ARM, XLNet) infilling: sequential decoding and ASSD.

:func:`assd_generate` is the entry point (:mod:`jaxspec.asarm.assd`); a method name maps to its
typed :class:`AssdVariant` (:mod:`jaxspec.asarm.config`). Modules, in the order a decode runs
through them: ``config`` (variant, loop statics and carry), ``inputs`` (task padding, decoding
order, attention orders, query window), ``passes`` (the AS-ARM forward, draft and density
passes), ``assd`` (Algorithm 1's verification and commit, the loop, the host wrapper),
``fused`` (the fused iteration), ``result`` (:class:`InfillResult`, :class:`ASSDStats`),
``infill`` (text templates).
"""

from jaxspec.asarm.assd import assd_generate
from jaxspec.asarm.config import METHODS, AssdVariant
from jaxspec.asarm.result import ASSDStats, InfillResult

__all__ = ["assd_generate", "METHODS", "AssdVariant", "ASSDStats", "InfillResult"]
