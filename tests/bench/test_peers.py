"""The peers of the device run (jaxspec.bench.peers): the static-cache + torch.compile peer
on a tiny HF model on the CPU (prompt pass eager, decode steps compiled, each step a new CUDA
graph step, tokens equal to the eager static-cache peer), and a peer that raises becomes a
row marked failed instead of ending the suite."""

from __future__ import annotations

import pytest

from jaxspec.bench import peers
from jaxspec.bench.ar_suite import run_ar_suite
from jaxspec.bench.records import BenchPrompt, RunOutput


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    why = peers.transformers_available()
    if why:
        pytest.skip(why)
    from jaxspec.testing.hf import build_tiny_hf

    try:
        return build_tiny_hf(tmp_path_factory.mktemp("hf") / "llama", arch="llama", seed=0)
    except Exception as e:  # noqa: BLE001 - transformers cannot build a model here
        pytest.skip(f"transformers cannot build a tiny model locally: {e}")


def test_static_compile_peer_compiles_only_decode_steps(tiny_hf, monkeypatch):
    import torch

    marks = []
    real_mark = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(
        torch.compiler, "cudagraph_mark_step_begin", lambda: (marks.append(1), real_mark())
    )
    model = tiny_hf.model.eval()
    common = dict(max_new_tokens=12, eos_ids=[], pad_id=0)
    eager = peers.static_compiled_system(model, compile=False, **common)
    # dynamo traces the whole decode step (fullgraph) as on the GPU; the eager backend keeps
    # the CPU test free of a C compiler
    compiled = peers.static_compiled_system(
        model, compile=True, compile_options={"backend": "eager", "fullgraph": True}, **common
    )
    assert (eager.method, compiled.method) == ("ar-static", "ar-static-compile")
    calls = compiled.model.forward.calls
    for ids in ([5, 17, 33, 8, 91, 4], [7, 7, 120, 3]):
        want = eager.run(ids)
        got = compiled.run(ids)
        assert got.tokens == want.tokens and len(got.tokens) == 12
        assert got.target_nfe == want.target_nfe == 12
    # one eager prompt pass per generate, every later step through the compiled forward, each
    # opening a new CUDA-graph step
    assert calls == {"eager": 2, "compiled": 22}
    assert len(marks) == 22


class _Fake:
    system = "fake"

    def __init__(self, method, fail_at=None, system="fake"):
        self.method, self.system, self.fail_at, self.calls = method, system, fail_at, 0

    @property
    def name(self):
        return f"{self.system}/{self.method}"

    def run(self, ids, max_new_tokens=None):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError(
                "Error: accessing tensor output of CUDAGraphs that has been overwritten by "
                "a subsequent run. Stack trace: File 'x.py', line 1"
            )
        return RunOutput(tokens=[1, 2, 3], seconds=0.01, target_nfe=3)


def test_a_failing_peer_is_a_failed_row_not_a_crash():
    prompts = [BenchPrompt("a", [4, 5]), BenchPrompt("b", [6, 7, 8])]
    systems = [
        _Fake("ar", system="jaxspec"),
        _Fake("ar-static-compile", fail_at=3, system="transformers"),
        _Fake("prompt-lookup", system="transformers"),
    ]
    result, failed = peers.run_contained(
        systems,
        lambda active: run_ar_suite(active, prompts, model_name="t", progress=False),
        log=lambda m: None,
    )
    assert [(r["system"], r["method"]) for r in result["rows"]] == [
        ("jaxspec", "ar"),
        ("transformers", "prompt-lookup"),
    ]
    assert failed == [
        {
            "system": "transformers",
            "method": "ar-static-compile",
            "failed": True,
            "skipped": "error: RuntimeError: Error: accessing tensor output of CUDAGraphs "
            "that has been overwritten by a subsequent run.",
        }
    ]
    # the baseline failing ends the suite with its row, not with a traceback
    result, failed = peers.run_contained(
        [_Fake("ar", fail_at=1, system="jaxspec"), _Fake("x")],
        lambda active: run_ar_suite(active, prompts, model_name="t", progress=False),
        log=lambda m: None,
    )
    assert result is None and [r["method"] for r in failed] == ["ar"]
