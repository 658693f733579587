"""Accelerator readiness of the decode loops, checked on CPU (issue 16): every decoder runs as
one compiled program with no host round trip inside it (no callbacks, infeed / outfeed or
send / recv in its StableHLO), and compiles once per shape bucket (different prompt lengths in
one bucket reuse the executable; a longer bucket compiles once more).

No loop donates buffers: the KV caches and token buffers are created inside the program and
the only inputs that outlive a call are the parameters, which the caller keeps."""

from __future__ import annotations

import pytest

import jaxspec.causal.decode as causal_decode
import jaxspec.dllm.decode as dllm_decode
import jaxspec.dllm.spiffy.decode as spiffy_decode
import jaxspec.dllm.ssd as ssd_module
from jaxspec.core import runtime
from jaxspec.core.drafters import NgramDrafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.dllm import DiffusionDecodeConfig, diffusion_generate
from jaxspec.dllm.spiffy import DraftGraph, SpiffyConfig, spiffy_generate
from jaxspec.dllm.ssd import SSDConfig, ssd_generate
from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model

HOST_OPS = ("callback", "infeed", "outfeed", "stablehlo.send", "stablehlo.recv")


@pytest.fixture
def programs(monkeypatch):
    """Record the StableHLO of every program the decoders' host wrappers run."""
    seen: list[str] = []

    def spy(jitted, args, statics):
        seen.append(jitted.lower(*args, **statics).as_text())
        return runtime.run_compiled(jitted, args, statics)

    for mod in (causal_decode, dllm_decode, ssd_module, spiffy_decode):
        monkeypatch.setattr(mod, "run_compiled", spy)
    return seen


def _no_host_ops(texts):
    assert texts
    for t in texts:
        found = [op for op in HOST_OPS if op in t]
        assert not found, f"host round trip inside a decode program: {found}"


def test_causal_loops_have_no_host_round_trips(programs):
    model, params = tiny_model()
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.8, top_k=5)):
        for drafter in (None, NgramDrafter(3, 64)):
            causal_decode.generate(
                model,
                params,
                [[1, 2, 3, 1, 2]],
                max_new_tokens=6,
                sampling=sampling,
                drafter=drafter,
            )
    assert len(programs) == 4
    _no_host_ops(programs)


def test_diffusion_loops_have_no_host_round_trips(programs):
    model, params = tiny_diffusion_model()
    d = DiffusionDecodeConfig(8, 4, 8, cache="dual", temperature=0.7)
    diffusion_generate(model, params, [[3, 4, 5]], d)
    ssd_generate(model, params, [[3, 4, 5]], SSDConfig(d, 2, "mix-order"))
    graph = DraftGraph((((1, 1),), ((1, 2),)))
    spiffy_generate(model, params, [[3, 4, 5]], SpiffyConfig(d, graph))
    assert len(programs) == 3
    _no_host_ops(programs)


@pytest.mark.parametrize("drafter", [None, NgramDrafter(3, 64)], ids=["ar", "ngram"])
def test_one_compile_per_prompt_bucket(drafter):
    model, params = tiny_model()
    kw = dict(max_new_tokens=5, drafter=drafter, bucket=16, seed=11)
    first = causal_decode.generate(model, params, [[1, 2, 3]], **kw)
    same_bucket = [
        causal_decode.generate(model, params, [list(range(1, n))], **kw) for n in (5, 12, 17)
    ]  # 4, 11 and 16 prompt tokens: bucket 16
    longer = causal_decode.generate(model, params, [list(range(1, 20))], **kw)  # bucket 32
    again = causal_decode.generate(model, params, [list(range(2, 25))], **kw)
    assert first.compile_s > 0
    assert [r.compile_s for r in same_bucket] == [0.0, 0.0, 0.0]
    assert longer.compile_s > 0 and again.compile_s == 0.0


def test_one_compile_per_prompt_bucket_diffusion():
    model, params = tiny_diffusion_model()
    d = DiffusionDecodeConfig(8, 4, 8)
    runs = [
        diffusion_generate(model, params, [list(range(3, n))], d, bucket=16) for n in (5, 9, 18, 30)
    ]  # 2, 6, 15, 27 tokens: buckets 16, 16, 16, 32
    assert [r.compile_s == 0.0 for r in runs] == [False, True, True, False]
