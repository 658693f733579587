"""Shared pytest fixtures: tiny random Hugging Face models (with a tiny byte-level BPE
tokenizer) saved to disk and their GGUF twins (built by :mod:`jaxspec.testing.hf`), and the
real SmolLM2 GGUF path."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import pytest

from jaxspec.core.compile_cache import enable_persistent_cache
from jaxspec.testing.hf import TinyHF, build_tiny_hf, write_tiny_gguf
from models.llama import layout

# Share XLA executables between test modules and pytest-xdist workers: the module-scoped
# fixture below drops the in-memory caches after each module to bound memory; with the
# persistent cache a later module that builds the same program loads it from disk.
# $JAXSPEC_TEST_COMPILE_CACHE names another directory, or is "off".
enable_persistent_cache(
    os.environ.get("JAXSPEC_TEST_COMPILE_CACHE")
    or Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax-compile"
)

# The scan layer loop: a 30-layer model compiles in a fraction of the unrolled loop's time (the
# CPU default). Both layouts compute the same tokens (tests/core/test_layer_layout.py sets each
# explicitly; the real golden smollm2/ar-greedy runs unrolled), so the rest of the suite runs
# scan wherever a decoder is left to choose ("auto"): the suite's rule replaces the machine's
# (models.llama.layout.machine_layer_loop) and reads $JAXSPEC_LAYER_LOOP at each call (the
# caller's value wins; "auto" is the machine's rule; a test may set it). The CLI subprocesses
# the suite starts take the same variable as their default (models.llama.layout.env_defaults).
os.environ.setdefault(layout.LAYER_LOOP_ENV, "scan")
_machine_layer_loop = layout.machine_layer_loop


def _suite_layer_loop(nbytes=None) -> str:
    name = os.environ.get(layout.LAYER_LOOP_ENV) or "scan"
    return _machine_layer_loop(nbytes) if name == "auto" else name


layout.machine_layer_loop = _suite_layer_loop

# Tiny-model tests spend most of their time compiling, so the suite compiles with XLA's
# optimisations mostly off (JAX's ``jax_disable_most_optimizations``: LLVM -O0, no expensive
# passes); measured on the 2-core AMD machine, 22 tiny SSD / golden / distribution tests took
# 174 s instead of 250 s. Tests marked ``real`` run the normal optimised build, which is faster
# for a 135M model (a real golden: 24 s vs 30 s) and is what users run, and so do tests marked
# ``optimised``: run-time-bound ones (10^4-row distribution tests; the heterogeneous-vocabulary
# one took 176 s unoptimised vs 121 s; the 121 s is from a run with other load). The goldens
# of `make test` pass either way. $JAX_DISABLE_MOST_OPTIMIZATIONS set by the caller wins (CLI
# subprocesses inherit it).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
jax.config.update(
    "jax_disable_most_optimizations",  # jax read the variable on import above
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() in ("1", "true", "yes", "on"),
)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """Factory ``tiny_hf(arch="llama", tied=False, seed=0, **dims) -> TinyHF`` (cached per
    argument set for the session). The directory holds config.json, model.safetensors,
    generation_config.json, tokenizer.json and tokenizer_config.json."""
    cache: dict = {}

    def make(arch: str = "llama", tied: bool = False, seed: int = 0, **overrides) -> TinyHF:
        key = (arch, tied, seed, tuple(sorted(overrides.items())))
        if key not in cache:
            name = f"tiny-{arch}-{'tied' if tied else 'untied'}-{seed}-{len(cache)}"
            cache[key] = build_tiny_hf(tmp_path_factory.mktemp(name), arch, tied, seed, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_hf) -> TinyHF:
    """Tiny random Llama with an untied LM head (rope_theta 5000)."""
    return tiny_hf("llama", tied=False)


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_hf) -> TinyHF:
    """Tiny random Qwen2 (q/k/v biases) with tied embeddings."""
    return tiny_hf("qwen2", tied=True)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """Factory ``tiny_gguf(tiny: TinyHF) -> Path``: the F32 GGUF twin of a tiny model."""
    cache: dict = {}

    def make(tiny: TinyHF) -> Path:
        if tiny.path not in cache:
            out = tmp_path_factory.mktemp("gguf") / f"{tiny.path.name}.gguf"
            cache[tiny.path] = write_tiny_gguf(tiny, out)
        return cache[tiny.path]

    return make


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the real SmolLM2-135M-Instruct GGUF from ``$JAXSPEC_SMOLLM2_GGUF`` (skips if
    unset or missing)."""
    p = os.environ.get("JAXSPEC_SMOLLM2_GGUF")
    if not p:
        pytest.skip("JAXSPEC_SMOLLM2_GGUF is not set")
    if not Path(p).is_file():
        pytest.skip(f"JAXSPEC_SMOLLM2_GGUF={p} does not exist")
    return Path(p)


@pytest.fixture(autouse=True)
def _optimised_build_for_real_models(request, monkeypatch):
    """Tests marked ``real`` or ``optimised`` compile with XLA's normal optimisations (see the
    top of this file), in this process and in the CLI subprocesses they start."""
    if not any(request.node.get_closest_marker(m) for m in ("real", "optimised")):
        yield
        return
    before = jax.config.values["jax_disable_most_optimizations"]
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every compiled program after each test module (JAX's caches and the decoders'
    executable caches), so a full run's memory does not grow with the number of modules."""
    yield
    from jaxspec.core.runtime import clear_compiled

    clear_compiled()
