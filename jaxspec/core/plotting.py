"""Headless matplotlib for the charts that benchmarks, calibration and training write.

Every chart in jaxspec is written to a PNG file, never shown, so the non-interactive ``Agg``
backend is selected before ``pyplot`` is imported (it works without a display: Colab, SSH,
CI). matplotlib is imported lazily so that decoding code never pays for it.
"""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` with the ``Agg`` backend selected (file output only).

    Raises:
      ImportError: matplotlib is not installed (it is a dependency of the package).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
