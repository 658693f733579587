"""Registry-driven losslessness: every method of :data:`jaxspec.methods.METHODS` runs on its
family's tiny model and is compared with the reference the registry names, through the same
path ``scripts.generate --compare`` takes. A method added to the registry is tested here
without editing this file."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxspec.methods import FAMILIES, METHODS, DecodeOptions, MethodError, get_method, \
    methods_of, reference_run

from tests.test_goldens import _tiny_graph, family_inputs



_inputs = family_inputs  # the goldens' adapter; kept for sharding_worker / test_diffuspec


def _rows(result):
    if hasattr(result, "full_tokens"):
        return np.asarray(result.full_tokens).tolist()
    if hasattr(result, "sequences"):
        return [np.asarray(s).tolist() for s in result.sequences]
    return result.tokens


def _graph_file(tmp_path):
    from jaxspec.dllm import save_graph

    path = tmp_path / "graph.json"
    save_graph(_tiny_graph(), path)
    return str(path)


def test_every_family_has_a_reference():
    for fam in FAMILIES:
        names = methods_of(fam)
        assert names, fam
        refs = {METHODS[n].reference for n in names}
        assert all(METHODS[r].reference == r for r in refs), refs


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.lossless])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_lossless_against_its_reference(name, temperature, tmp_path):
    method = get_method(name)
    model, params, inputs, opts = _inputs(method.family)
    opts = dataclasses.replace(opts, temperature=temperature,
                               graph=_graph_file(tmp_path) if name == "spiffy" else None)
    res = method.run(model, params, inputs, method.build(opts), seed=3)
    ref_method, ref_cfg = reference_run(method, opts)
    ref = ref_method.run(model, params, inputs, ref_cfg, seed=3)
    assert res.stats.reference == ref.stats.method
    if temperature == 0.0 or method.family == "dllm":
        # greedy: identical tokens; dLLM methods replay the reference's sample path too
        assert _rows(res) == _rows(ref)
    else:
        # sampling: only the distribution is equal (tested per method); here: same lengths,
        # and a seed reproduces the run exactly
        again = method.run(model, params, inputs, method.build(opts), seed=3)
        assert _rows(again) == _rows(res)
        assert [len(r) for r in _rows(res)] == [len(r) for r in _rows(ref)]


def test_unknown_and_wrong_family():
    with pytest.raises(MethodError, match="unknown method"):
        get_method("nope")
    with pytest.raises(MethodError, match="needs a dllm model"):
        get_method("ssd", "causal")
    with pytest.raises(ValueError, match="tokens-per-step"):
        get_method("fixed-k").build(DecodeOptions())
    with pytest.raises(ValueError, match="needs a draft model"):
        get_method("sps").build(DecodeOptions())
    with pytest.raises(ValueError, match="needs a diffusion drafter"):
        get_method("diffuspec").build(DecodeOptions())
    with pytest.raises(ValueError, match="--mask-groups must be >= 1"):
        get_method("space").build(DecodeOptions(mask_groups=0))
    model, params = tiny_model(64, seed=0)  # no [MASK] token: not a SAR-SFT model
    with pytest.raises(ValueError, match="needs a SAR-SFT model"):
        get_method("space").run(model, params, [[1, 2]], get_method("space").build(DecodeOptions()))


def test_default_graph_is_pruned_to_the_block():
    """The default graph (calibrated at block 32) loses the formulas a smaller block cannot
    draft, and stays a valid graph (every kept formula's parent kept)."""
    from jaxspec.methods import DEFAULT_GRAPH, default_graph
    from jaxspec.dllm.spiffy import load_graph

    full = load_graph(DEFAULT_GRAPH)
    assert default_graph(32).formulas == full.formulas
    small = default_graph(4)
    assert small.formulas and all(i <= 4 for f in small.formulas for i, _ in f)
    assert set(small.formulas) == {f for f in full.formulas if max(i for i, _ in f) <= 4}
