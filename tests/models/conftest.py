"""Fixtures of the CPU kernel tests (tests/models/test_panels.py, test_attention.py)."""

from __future__ import annotations

import pytest

from models.llama import attention, panels


@pytest.fixture(scope="module")
def kernel():
    """Skip where the CPU kernels cannot be built (no C++ compiler, not x86-64 Linux); the
    tests that use it run with the panel layout and the attention kernel on
    (:data:`panels.PANELS`, :data:`attention.KERNEL` True), also on a CPU without AVX2 + FMA,
    where the panels are off by default."""
    try:
        panels.build()
    except panels.KernelBuildError as e:
        pytest.skip(f"CPU kernels unavailable: {e}")
    assert panels._load()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(panels, "PANELS", True)
        mp.setattr(attention, "KERNEL", True)
        yield
