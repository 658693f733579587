"""A jaxspec Dream exported as a Hugging Face Dream folder (models.diffusion.hf_export) computes
the same function elsewhere:

* transformers' own Qwen2 reads the folder and, given a full (non-causal) attention mask,
  returns jaxspec's raw logits (float32; always runs where transformers is installed), while
  its default causal mask does not;
* the official Fast-dLLM Dream code (``third_party/Fast-dLLM``, git-ignored; skipped without
  it) loads the folder with its own modeling code and returns the same logits, and its
  dual-cache threshold block decoder returns the same tokens as jaxspec's ``threshold``
  method with ``block_start="first-position"`` and ``cache="dual"``.

A jaxspec LLaDA exported as a LLaDA folder (``export_llada_hf``) loads back bit for bit
(``load_llada_dir``); the official Fast-dLLM LLaDA modeling code (skipped without the checkout,
torch or einops) returns jaxspec's logits, and its three decoders (``generate``,
``generate_with_prefix_cache``, ``generate_with_dual_cache``; stepwise or threshold) make
jaxspec's decisions with the matching ``cache`` and rule.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.bench import peers
from jaxspec.testing.tiny import tiny_diffusion_model
from models.diffusion.hf_export import GENERATION_CONFIG, export_dream_hf, export_llada_hf

VOCAB = 40  # mask id 39
IDS = np.array([[5, 7, 9, 11, 39, 39, 39, 39, 3, 4, 39, 39]])
PROMPTS = [[5, 7, 9, 11, 3], [12, 13, 14, 15, 16, 17, 8], [20, 4]]
GEN, BLOCK = 16, 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model, params = tiny_diffusion_model("dream", vocab=VOCAB, ctx=64)
    folder = export_dream_hf(tmp_path_factory.mktemp("dream") / "hf", model, params, eos_ids=[2])
    return model, params, folder


def _ours(model, params):
    T = IDS.shape[1]
    logits, _ = model.apply(params, jnp.asarray(IDS), jnp.arange(T)[None], shift=False)
    return np.asarray(logits)


def test_folder_holds_dream_config_and_zero_biases(exported):
    from safetensors.numpy import load_file

    model, params, folder = exported
    conf = json.loads((folder / "config.json").read_text())
    assert conf["model_type"] == "Dream" and conf["mask_token_id"] == VOCAB - 1
    assert conf["tie_word_embeddings"] is False and "head_dim" not in conf
    gen = json.loads((folder / GENERATION_CONFIG).read_text())
    assert gen["mask_token_id"] == VOCAB - 1 and gen["eos_token_id"] == 2
    tensors = {}
    for f in folder.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    wq = np.asarray(params["layers"]["wq"][1])
    np.testing.assert_array_equal(tensors["model.layers.1.self_attn.q_proj.weight"], wq.T)
    np.testing.assert_array_equal(
        tensors["model.layers.0.self_attn.k_proj.bias"], np.asarray(params["layers"]["bk"][0])
    )


def test_biasless_tied_body_gets_zero_biases_and_an_explicit_head(tmp_path):
    from safetensors.numpy import load_file

    from jaxspec.testing.tiny import tiny_model
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM

    body, params = tiny_model(vocab=VOCAB, arch="llama")  # no biases, tied head
    model = DiffusionLM(DiffusionConfig(body.config.replace(tie_embeddings=True), "dream", 39))
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    params = {k: v for k, v in params.items() if k != "lm_head"}
    folder = export_dream_hf(tmp_path / "hf", model, {"params": params}, torch_dtype="bfloat16")
    tensors = {}
    for f in folder.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    assert not tensors["model.layers.0.self_attn.v_proj.bias"].any()
    embed = np.asarray(params["embed"], np.float32)  # bfloat16 written exactly as float32
    np.testing.assert_array_equal(tensors["lm_head.weight"], embed)
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], embed)
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_export_rejects_llada_and_odd_head_width(tmp_path):
    model, params = tiny_diffusion_model("llada", vocab=VOCAB)
    with pytest.raises(ValueError, match="head is 'llada'"):
        export_dream_hf(tmp_path / "a", model, params)
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM

    dream, params = tiny_diffusion_model("dream", vocab=VOCAB)
    odd = DiffusionLM(DiffusionConfig(dream.config.base.replace(head_dim=4), "dream", 39))
    with pytest.raises(ValueError, match="head_dim 4"):
        export_dream_hf(tmp_path / "b", odd, params)


def test_transformers_qwen2_with_a_full_mask_matches(exported):
    why = peers.transformers_available()
    if why:
        pytest.skip(why)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model, params, folder = exported
    conf = json.loads((folder / "config.json").read_text())
    conf = {k: v for k, v in conf.items() if k not in ("model_type", "architectures")}
    hf = Qwen2ForCausalLM.from_pretrained(
        str(folder), config=Qwen2Config(**conf), torch_dtype=torch.float32
    ).eval()
    T = IDS.shape[1]
    with torch.no_grad():
        full = hf(torch.tensor(IDS), attention_mask=torch.ones(1, 1, T, T, dtype=torch.bool))
        causal = hf(torch.tensor(IDS))
    ours = _ours(model, params)
    np.testing.assert_allclose(full.logits.numpy(), ours, atol=1e-4, rtol=1e-5)
    assert np.abs(causal.logits.numpy() - ours).max() > 1e-2  # the mask matters


@pytest.fixture(scope="module")
def official(exported):
    try:
        return peers.load_dream_hf(exported[2])
    except peers.PeerUnavailable as e:
        pytest.skip(f"official Fast-dLLM Dream code unavailable: {e}")


def test_official_dream_modeling_matches_logits(exported, official):
    import torch

    model, params, _ = exported
    with torch.no_grad():
        theirs = official(torch.tensor(IDS), "full").logits.numpy()
    np.testing.assert_allclose(theirs, _ours(model, params), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("threshold", [0.9, 0.3])
def test_official_block_decoder_matches_first_position_threshold(exported, official, threshold):
    from jaxspec.methods import get_method, run

    model, params, _ = exported
    m = get_method("threshold", "dllm")
    cfg = m.configure(
        gen_length=GEN,
        block_length=BLOCK,
        cache="dual",
        threshold=threshold,
        block_start="first-position",
    )
    nfes = []
    for p in PROMPTS:
        theirs, nfe = peers.fastdllm_dream_generate(
            official, p, gen_length=GEN, block_length=BLOCK, threshold=threshold, mask_id=39
        )
        res = run(m, model, params, [p], cfg)
        assert [int(t) for t in res.tokens[0]] == theirs, p
        assert int(res.stats.target_nfe[0]) == nfe
        nfes.append(nfe)
    if threshold < 0.5:  # the parallel path ran: some step committed several positions
        assert min(nfes) < GEN


def _vehicle(exported):
    from jaxspec.bench.device import Vehicle

    model, params, _ = exported
    return Vehicle("tiny-dream", "dllm", model, params, eos_ids=(2,), pad_id=0)


def test_dream_peer_rows_compare_with_jaxspec(exported, official):
    from jaxspec.bench.device import RunSettings

    rows, notes = peers.fastdllm_dream_rows(
        {"dllm": _vehicle(exported)},
        {"dllm": PROMPTS},
        RunSettings.smoke(),
        n=2,
        deadline_s=600.0,
        log=lambda m: None,
    )
    ours, theirs = rows
    assert ours["system"] == "jaxspec" and ours["prompts"] == 2
    assert (theirs["system"], theirs["method"]) == peers.DREAM_PEER
    assert theirs["identical_to_reference"] is True and theirs["identical_share"] == 1.0
    assert theirs["nfe_per_token"] == ours["nfe_per_token"] > 0
    assert any("generation_utils_block.py" in n for n in notes)


def test_dream_peer_without_checkout_is_a_skipped_row(exported, tmp_path, monkeypatch):
    from jaxspec.bench.device import RunSettings

    monkeypatch.setenv(peers.FASTDLLM_ENV, str(tmp_path / "none"))
    rows, notes = peers.fastdllm_dream_rows(
        {"dllm": _vehicle(exported)}, {"dllm": PROMPTS}, RunSettings.smoke(), 1, 60.0
    )
    assert len(rows) == 1 and "official Fast-dLLM code not found" in rows[0]["skipped"]
    assert notes == []


def test_pack_carries_only_the_decoding_files(tmp_path, monkeypatch):
    fake = tmp_path / "Fast-dLLM"
    for rel in [
        "LICENSE",
        "dream/model/generation_utils_block.py",
        "dream/model/modeling_dream.py",
        "dream/eval.py",
        "llada/generate.py",
        "asset/big.gif",
    ]:
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(rel)
    assert peers.pack_fastdllm(tmp_path / "none.tgz", root=str(tmp_path / "absent")) is None
    tar = peers.pack_fastdllm(tmp_path / "fd.tar.gz", root=str(fake))
    monkeypatch.setenv(peers.FASTDLLM_ENV, str(tmp_path / "absent"))
    out = peers.unpack_fastdllm(tar, tmp_path / "out")
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == [
        "LICENSE",
        "dream/model/generation_utils_block.py",
        "dream/model/modeling_dream.py",
        "llada/generate.py",
    ]
    assert (out / "llada/generate.py").read_text() == "llada/generate.py"
    assert peers.fastdllm_root() == out  # the device run finds the unpacked code


# ----------------------------------------------------------------------------- LLaDA


@pytest.fixture(scope="module")
def llada_exported(tmp_path_factory):
    model, params = tiny_diffusion_model("llada", vocab=VOCAB, ctx=64)
    folder = export_llada_hf(tmp_path_factory.mktemp("llada") / "hf", model, params, eos_ids=[2])
    return model, params, folder


def _tied_llada():
    """The tiny LLaDA with a tied head (no ``lm_head``: the transposed embedding)."""
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM

    model, params = tiny_diffusion_model("llada", vocab=VOCAB, ctx=64, seed=2)
    tied = DiffusionLM(DiffusionConfig(model.config.base.replace(tie_embeddings=True), "llada", 39))
    return tied, {k: v for k, v in params.items() if k != "lm_head"}


def _same_tree(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
    return [k for k, _ in la] == [k for k, _ in lb] and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
        for (_, x), (_, y) in zip(la, lb)
    )


@pytest.mark.parametrize("tied", [False, True])
def test_llada_export_round_trips_bitwise(tmp_path, tied):
    from safetensors.numpy import load_file

    from models.diffusion.params import load_llada_dir

    model, params = _tied_llada() if tied else tiny_diffusion_model("llada", vocab=VOCAB)
    folder = export_llada_hf(tmp_path / "hf", model, params, eos_ids=[2, 3], pad_id=0)
    conf = json.loads((folder / "config.json").read_text())
    assert conf["model_type"] == "llada" and conf["weight_tying"] is tied
    assert (conf["block_type"], conf["activation_type"], conf["layer_norm_type"]) == (
        "llama",
        "silu",
        "rms",
    )
    assert conf["rope"] and not conf["alibi"] and conf["residual_dropout"] == 0.0
    tensors = {}
    for f in folder.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    assert ("model.transformer.ff_out.weight" in tensors) is not tied
    np.testing.assert_array_equal(
        tensors["model.transformer.blocks.1.ff_proj.weight"],
        np.asarray(params["layers"]["w_gate"][1]).T,
    )
    cfg, back = load_llada_dir(folder)
    assert _same_tree(back, params)
    assert cfg.head == "llada" and cfg.mask_token_id == 39
    assert cfg.base == model.config.base.replace(eos_token_ids=(2, 3), pad_token_id=0)


def test_llada_export_rejects_dream_and_odd_head_width(tmp_path):
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM

    dream, params = tiny_diffusion_model("dream", vocab=VOCAB)
    with pytest.raises(ValueError, match="head is 'dream'"):
        export_llada_hf(tmp_path / "a", dream, params)
    llada, params = tiny_diffusion_model("llada", vocab=VOCAB)
    odd = DiffusionLM(DiffusionConfig(llada.config.base.replace(head_dim=4), "llada", 39))
    with pytest.raises(ValueError, match="head_dim 4"):
        export_llada_hf(tmp_path / "b", odd, params)


def _official_llada(folder):
    try:
        return peers.load_llada_hf(folder)
    except peers.PeerUnavailable as e:
        pytest.skip(f"official Fast-dLLM LLaDA code unavailable: {e}")


@pytest.fixture(scope="module")
def llada_official(llada_exported):
    return _official_llada(llada_exported[2])


@pytest.mark.parametrize("tied", [False, True])
def test_official_llada_modeling_matches_logits(llada_exported, llada_official, tmp_path, tied):
    import torch

    if tied:
        model, params = _tied_llada()
        hf, _ = _official_llada(export_llada_hf(tmp_path / "hf", model, params))
    else:
        model, params, _ = llada_exported
        hf = llada_official[0]
    with torch.no_grad():
        theirs = hf(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(theirs, _ours(model, params), atol=1e-4, rtol=1e-5)


def _opened_full(transfer_step: np.ndarray, block: int) -> int:
    """Blocks that their first step unmasked entirely (every position transferred at the
    block's first step)."""
    steps = transfer_step.reshape(-1, block)
    return int(np.sum(steps.min(axis=1) == steps.max(axis=1)))


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("rule", [("stepwise", GEN), ("stepwise", GEN // 2), 0.9, 0.3])
def test_official_llada_decoders_match_jaxspec(llada_exported, llada_official, cache, rule):
    """Fast-dLLM's ``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
    (``threshold`` None with ``steps``, or a threshold) make jaxspec's decisions: the same
    tokens at every position; the NFE differ only by the forward the official cached loop
    spends after a block its opening full forward unmasked entirely."""
    from jaxspec.methods import get_method, run

    model, params, _ = llada_exported
    hf, gen = llada_official
    shared = dict(gen_length=GEN, block_length=BLOCK, cache=cache)
    if isinstance(rule, tuple):
        steps, threshold = rule[1], None
        m = get_method("stepwise", "dllm")
        cfg = m.configure(steps=steps, **shared)
    else:
        steps, threshold = GEN, rule
        m = get_method("threshold", "dllm")
        cfg = m.configure(threshold=threshold, **shared)
    nfes = []
    for p in PROMPTS:
        theirs, nfe = peers.fastdllm_llada_generate(
            hf, gen, p, steps=steps, threshold=threshold, mask_id=39, **shared
        )
        res = run(m, model, params, [p], cfg)
        assert [int(t) for t in res.full_tokens[0]] == theirs, p
        extra = 0 if cache == "none" else _opened_full(res.transfer_step[0], BLOCK)
        assert nfe == int(res.stats.target_nfe[0]) + extra, p
        nfes.append(nfe)
    if threshold is not None and threshold < 0.5:  # the parallel path ran
        assert min(nfes) < GEN


def test_official_llada_predicts_mask_where_jaxspec_does_not(llada_exported, llada_official):
    """The one rule difference: the official arg-max ranges over [MASK]. With blocks of 8 the
    tiny model predicts [MASK] at a masked position of this prompt's canvas, so the official
    stepwise loop ends a block still masked and the threshold loop stalls; jaxspec (whose
    arg-max leaves [MASK] out) decodes every position."""
    from jaxspec.methods import get_method, run

    model, params, _ = llada_exported
    hf, gen = llada_official
    p = PROMPTS[0]
    seen = []

    def grab(module, args, out):  # did a masked input position predict [MASK]?
        seen.append(bool(((out.logits.argmax(-1) == 39) & (args[0] == 39)).any()))

    shared = dict(gen_length=GEN, block_length=8, cache="none", mask_id=39)
    handle = hf.register_forward_hook(grab)
    try:
        for threshold in (None, 0.9):
            with pytest.raises(RuntimeError, match=r"predicts \[MASK\]"):
                peers.fastdllm_llada_generate(hf, gen, p, steps=GEN, threshold=threshold, **shared)
            assert seen[-1]
    finally:
        handle.remove()
    m = get_method("threshold", "dllm")
    res = run(m, model, params, [p], m.configure(gen_length=GEN, block_length=8, threshold=0.9))
    assert 39 not in res.full_tokens[0].tolist()


def test_llada_decode_config_is_the_official_rule():
    from jaxspec.bench.device import RunSettings

    s = RunSettings.smoke()
    _, cfg = peers.llada_decode_config("prefix", None, s)
    d = cfg.diffusion()
    assert (d.method, d.steps, d.cache, d.remasking) == (
        "stepwise",
        s.gen_length,
        "prefix",
        "low_confidence",
    )
    _, cfg = peers.llada_decode_config("dual", 0.9, s)
    d = cfg.diffusion()
    assert (d.method, d.threshold, d.block_start, d.confidence_softmax) == (
        "threshold",
        0.9,
        "rule",
        "official",
    )


@pytest.mark.parametrize("head", ["llada", "dream"])
def test_llada_peer_rows_compare_with_jaxspec(llada_official, head):
    """The LLaDA pairs on a LLaDA vehicle and on a Dream vehicle read with the LLaDA head
    (the device suite's case: its dllm vehicle is a Dream)."""
    from jaxspec.bench.device import RunSettings, Vehicle

    model, params = tiny_diffusion_model(head, vocab=VOCAB, ctx=64)
    v = Vehicle(f"tiny-{head}", "dllm", model, params, eos_ids=(2,), pad_id=0)
    pairs = (("dual", 0.9), ("none", None))
    rows, notes = peers.fastdllm_llada_rows(
        {"dllm": v},
        {"dllm": PROMPTS},
        dataclasses.replace(RunSettings.smoke(), gen_length=GEN, block_length=BLOCK),
        n=2,
        deadline_s=600.0,
        pairs=pairs,
        log=lambda m: None,
    )
    assert len(rows) == 4
    for (cache, threshold), ours, theirs in zip(pairs, rows[::2], rows[1::2]):
        assert (ours["system"], ours["prompts"]) == ("jaxspec", 2)
        assert theirs["method"] == peers.llada_labels(cache, threshold)[1]
        assert theirs["identical_to_reference"] is True and theirs["identical_share"] == 1.0
        assert theirs["nfe_per_token"] >= ours["nfe_per_token"] > 0
    assert any("llada/generate.py" in n for n in notes)
    assert ("read with the LLaDA head" in notes[0]) is (head == "dream")


def test_llada_peer_without_checkout_is_skipped_rows(tmp_path, monkeypatch):
    from jaxspec.bench.device import RunSettings, Vehicle

    monkeypatch.setenv(peers.FASTDLLM_ENV, str(tmp_path / "none"))
    model, params = tiny_diffusion_model("llada", vocab=VOCAB, ctx=64)
    v = Vehicle("tiny-llada", "dllm", model, params, eos_ids=(2,), pad_id=0)
    rows, notes = peers.fastdllm_llada_rows(
        {"dllm": v}, {"dllm": PROMPTS}, RunSettings.smoke(), 1, 60.0
    )
    assert len(rows) == len(peers.LLADA_SETTINGS) and notes == []
    assert all("official Fast-dLLM code not found" in r["skipped"] for r in rows)
    rows, _ = peers.fastdllm_llada_rows({}, {"dllm": PROMPTS}, RunSettings.smoke(), 1, 60.0)
    assert all(r["skipped"] == "no dllm vehicle" for r in rows)
