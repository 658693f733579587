"""Bidirectional LLaDA / Dream models (:mod:`models.diffusion.modeling`) and their loaders.

Tiny random transformers Llama / Qwen2 models (``conftest.tiny_hf``) are re-saved in the
LLaDA layout (renamed tensors, LLaDA-style config.json) and as Dream directories, loaded
with our loaders, and compared with transformers run under a full non-causal 4D attention
mask (a ``(B, 1, T, T)`` float tensor: 0 = attend, dtype-min = blocked) to 1e-4 in float32.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.config import ModelConfig
from models.diffusion.modeling import DiffusionConfig, DiffusionLM, bidirectional_mask, shift_logits
from models.diffusion.params import load_diffusion_dir, load_dream_dir, load_llada_dir
from models.llama.modeling import init_cache
from models.llama.params import WeightFileError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, T, PREFIX, CACHE = 2, 10, 6, 12
TOL = 1e-4
LLADA_MASK_ID, DREAM_MASK_ID = 299, 298


# ----------------------------------------------------------------------------- fixtures


def _hf_to_llada_name(name: str) -> str:
    """transformers Llama tensor name -> LLaDA (``LLaDAModelLM``) name."""
    top = {
        "model.embed_tokens.weight": "model.transformer.wte.weight",
        "model.norm.weight": "model.transformer.ln_f.weight",
        "lm_head.weight": "model.transformer.ff_out.weight",
    }
    if name in top:
        return top[name]
    layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "q_proj",
        "self_attn.k_proj": "k_proj",
        "self_attn.v_proj": "v_proj",
        "self_attn.o_proj": "attn_out",
        "post_attention_layernorm": "ff_norm",
        "mlp.gate_proj": "ff_proj",
        "mlp.up_proj": "up_proj",
        "mlp.down_proj": "ff_out",
    }
    _, _, i, rest = name.split(".", 3)
    mod, param = rest.rsplit(".", 1)
    return f"model.transformer.blocks.{i}.{layer[mod]}.{param}"


def _write_llada_dir(tiny, out, prefixed: bool = True):
    from safetensors.numpy import save_file

    c = tiny.hf_config
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in tiny.model.state_dict().items()}
    if tiny.tied:
        sd.pop("lm_head.weight", None)
    tensors = {}
    for k, v in sd.items():
        name = _hf_to_llada_name(k)
        tensors[name if prefixed else name[len("model.") :]] = np.ascontiguousarray(v)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    theta = (
        (c.rope_parameters or {}).get("rope_theta")
        if getattr(c, "rope_parameters", None)
        else c.rope_theta
    )
    cfg = {  # keys as in LLaDA's configuration_llada.py / LLaDA-8B config.json
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "d_model": c.hidden_size,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "n_layers": c.num_hidden_layers,
        "mlp_hidden_size": c.intermediate_size,
        "mlp_ratio": 4,
        "vocab_size": c.vocab_size,
        "embedding_size": c.vocab_size,
        "rope_theta": float(theta),
        "rms_norm_eps": c.rms_norm_eps,
        "include_bias": False,
        "include_qkv_bias": False,
        "weight_tying": bool(tiny.tied),
        "mask_token_id": LLADA_MASK_ID,
        "max_sequence_length": 128,
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "rope": True,
        "alibi": False,
        "scale_logits": False,
        "block_group_size": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def _write_dream_dir(tiny, out):
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(tiny.path / "model.safetensors", out / "model.safetensors")
    cfg = json.loads((tiny.path / "config.json").read_text())
    cfg.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=DREAM_MASK_ID)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


@pytest.fixture(scope="module")
def llada(tiny_hf, tmp_path_factory):
    """(tiny Llama TinyHF, LLaDA dir)."""
    tiny = tiny_hf("llama", tied=False)
    return tiny, _write_llada_dir(tiny, tmp_path_factory.mktemp("llada"))


@pytest.fixture(scope="module")
def dream(tiny_hf, tmp_path_factory):
    """(tiny Qwen2 TinyHF, Dream dir)."""
    tiny = tiny_hf("qwen2", tied=True)
    return tiny, _write_dream_dir(tiny, tmp_path_factory.mktemp("dream"))


# ----------------------------------------------------------------------------- helpers


def _torch_logits(model, tokens: np.ndarray, mask4d: np.ndarray | None) -> np.ndarray:
    """transformers logits with ``mask4d`` bool (B, T, T) as a float (B, 1, T, T) mask."""
    kw = {}
    if mask4d is not None:
        bias = np.where(mask4d, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None]
        kw["attention_mask"] = torch.as_tensor(bias)
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long), **kw).logits.float().numpy()


def _pos(b: int, t: int):
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


def _tokens(seed: int, vocab: int, mask_id: int) -> np.ndarray:
    rs = np.random.RandomState(seed)
    tok = rs.randint(0, vocab, size=(B, T))
    tok[:, 1:][rs.rand(B, T - 1) < 0.4] = mask_id  # some masked positions, never position 0
    return tok


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("prefixed", [True, False])
def test_llada_matches_torch_bidirectional(llada, tmp_path, prefixed):
    tiny, d = llada
    if not prefixed:
        d = _write_llada_dir(tiny, tmp_path / "noprefix", prefixed=False)
    cfg, params = load_llada_dir(d)
    assert (cfg.head, cfg.mask_token_id, cfg.base.vocab_size, cfg.base.rope_theta) == (
        "llada",
        LLADA_MASK_ID,
        300,
        5000.0,
    )
    assert (cfg.base.num_kv_heads, cfg.base.tie_embeddings, cfg.base.qkv_bias) == (2, False, False)
    model = DiffusionLM(cfg)
    tokens = _tokens(1, cfg.vocab_size, cfg.mask_token_id)
    ours, cache = jax.jit(model.apply)(params, jnp.asarray(tokens), _pos(B, T))
    assert cache is None and ours.dtype == jnp.float32 and ours.shape == (B, T, 300)
    full = np.ones((B, T, T), bool)
    ref = _torch_logits(tiny.model, tokens, full)
    causal = _torch_logits(tiny.model, tokens, None)
    diff = float(np.abs(np.asarray(ours) - ref).max())
    gap = float(np.abs(causal - ref).max())
    print(
        f"llada prefixed={prefixed}: max|ours - torch bidirectional| = {diff:.2e}; "
        f"torch causal vs bidirectional differ by {gap:.2e}"
    )
    assert gap > 1e-2  # the 4D mask really is non-causal, so this test can fail
    assert diff < TOL


def test_dream_matches_torch_shifted(dream):
    tiny, d = dream
    cfg, params = load_dream_dir(d)
    assert (
        cfg.head,
        cfg.mask_token_id,
        cfg.base.arch,
        cfg.base.qkv_bias,
        cfg.base.tie_embeddings,
    ) == ("dream", DREAM_MASK_ID, "qwen2", True, True)
    model = DiffusionLM(cfg)
    tokens = _tokens(2, cfg.vocab_size, cfg.mask_token_id)
    apply = jax.jit(model.apply, static_argnames="shift")
    out, _ = apply(params, jnp.asarray(tokens), _pos(B, T))
    raw, _ = apply(params, jnp.asarray(tokens), _pos(B, T), shift=False)
    out, raw = np.asarray(out), np.asarray(raw)
    ref = _torch_logits(tiny.model, tokens, np.ones((B, T, T), bool))
    gap = float(np.abs(_torch_logits(tiny.model, tokens, None) - ref).max())
    d_raw = float(np.abs(raw - ref).max())
    ref_shift = np.concatenate([ref[:, :1], ref[:, :-1]], axis=1)
    d_shift = float(np.abs(out - ref_shift).max())
    print(
        f"dream: raw vs torch bidirectional {d_raw:.2e}, shifted vs shifted torch {d_shift:.2e}, "
        f"causal gap {gap:.2e}"
    )
    assert gap > 1e-2
    assert d_raw < TOL and d_shift < TOL
    # the shift, explicitly: out[:, i] = raw[:, i-1] (i >= 1), out[:, 0] = raw[:, 0]
    np.testing.assert_array_equal(out[:, 1:], raw[:, :-1])
    np.testing.assert_array_equal(out[:, 0], raw[:, 0])
    assert float(np.abs(out - raw).max()) > 1e-2  # and it is not the identity


def test_shift_logits_convention():
    raw = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
    out = np.asarray(shift_logits(raw))
    np.testing.assert_array_equal(out[:, 0], np.asarray(raw[:, 0]))
    np.testing.assert_array_equal(out[:, 1:], np.asarray(raw[:, :-1]))


def test_load_diffusion_dir_dispatches(llada, dream):
    assert load_diffusion_dir(llada[1])[0].head == "llada"
    assert load_diffusion_dir(dream[1])[0].head == "dream"


# ----------------------------------------------------------------------------- padding, cache


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_left_padding_matches_unpadded(which, request):
    tiny, d = request.getfixturevalue(which)
    cfg, params = load_diffusion_dir(d)
    model = DiffusionLM(cfg)
    apply = jax.jit(model.apply)
    rs = np.random.RandomState(3)
    lengths = [T, T - 4]
    pad = T - np.array(lengths)
    tokens = np.zeros((B, T), np.int64)
    valid = np.zeros((B, T), bool)
    positions = np.zeros((B, T), np.int32)
    rows = []
    for b, n in enumerate(lengths):
        row = rs.randint(0, cfg.vocab_size, size=n)
        rows.append(row)
        tokens[b, pad[b] :] = row
        valid[b, pad[b] :] = True
        positions[b, pad[b] :] = np.arange(n)
    mask = bidirectional_mask(jnp.asarray(valid))
    padded, _ = apply(params, jnp.asarray(tokens), jnp.asarray(positions), mask)
    padded = np.asarray(padded)
    worst = 0.0
    for b, n in enumerate(lengths):
        alone, _ = apply(params, jnp.asarray(rows[b])[None], _pos(1, n))
        ours = padded[b, pad[b] :]
        if cfg.head == "dream":  # the shift of a left-padded row starts at the pad boundary
            ours = ours[1:]
            alone = alone[:, 1:]
        worst = max(worst, float(np.abs(ours - np.asarray(alone)[0]).max()))
        ref = _torch_logits(tiny.model, rows[b][None], np.ones((1, n, n), bool))[0]
        ref = ref[:-1] if cfg.head == "dream" else ref
        worst = max(worst, float(np.abs(ours - ref).max()))
    print(f"{which}: left-padded vs unpadded (ours and torch) max diff {worst:.2e}")
    assert worst < TOL


def test_bidirectional_mask_shape_and_pad_rows():
    valid = jnp.array([[False, True, True], [True, True, True]])
    m = np.asarray(bidirectional_mask(valid))
    assert m.shape == (2, 3, 3) and m.dtype == bool
    np.testing.assert_array_equal(
        m[0], [[True, False, False], [False, True, True], [False, True, True]]
    )
    assert m[1].all()


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_kv_cache_prefix_matches_full_pass(which, request):
    """Prefill the prefix into the cache (prefix sees prefix), then feed the rest seeing every
    slot: equals one full pass under the same block mask (prefix rows blind to the suffix)."""
    _, d = request.getfixturevalue(which)
    cfg, params = load_diffusion_dir(d)
    model = DiffusionLM(cfg)
    apply = jax.jit(model.apply, static_argnames="shift")
    tokens = jnp.asarray(_tokens(4, cfg.vocab_size, cfg.mask_token_id))
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    block = (k < PREFIX) | (q >= PREFIX)  # (T, T)
    full, _ = apply(params, tokens, _pos(B, T), jnp.broadcast_to(block, (B, T, T)), shift=False)
    full = np.asarray(full)

    cache = init_cache(cfg.base, B, CACHE)
    slots = np.arange(CACHE)[None, :]
    pre_mask = jnp.broadcast_to(jnp.asarray(slots < PREFIX), (B, PREFIX, CACHE))
    pre, cache = apply(
        params,
        tokens[:, :PREFIX],
        _pos(B, PREFIX),
        pre_mask,
        cache=cache,
        cache_index=jnp.zeros((B,), jnp.int32),
        shift=False,
    )
    rest_mask = jnp.broadcast_to(jnp.asarray(slots < T), (B, T - PREFIX, CACHE))
    rest_pos = jnp.broadcast_to(jnp.arange(PREFIX, T, dtype=jnp.int32), (B, T - PREFIX))
    rest, _ = apply(
        params,
        tokens[:, PREFIX:],
        rest_pos,
        rest_mask,
        cache=cache,
        cache_index=jnp.full((B,), PREFIX, jnp.int32),
        shift=False,
    )
    d_pre = float(np.abs(np.asarray(pre) - full[:, :PREFIX]).max())
    d_rest = float(np.abs(np.asarray(rest) - full[:, PREFIX:]).max())
    print(f"{which}: cached prefix {d_pre:.2e}, cached rest {d_rest:.2e}")
    assert max(d_pre, d_rest) < TOL
    # differs from the fully bidirectional pass (the prefix cache is a different mask)
    bi, _ = apply(params, tokens, _pos(B, T), shift=False)
    assert float(np.abs(np.asarray(bi)[:, PREFIX:] - np.asarray(rest)).max()) > 1e-3


# ----------------------------------------------------------------------------- bad input


def test_mask_id_outside_vocab_raises():
    base = ModelConfig(
        arch="llama",
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
    )
    for bad in (50, -1, 10**6):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            DiffusionConfig(base=base, head="llada", mask_token_id=bad)
    with pytest.raises(ValueError, match="unknown diffusion head"):
        DiffusionConfig(base=base, head="xlnet", mask_token_id=3)
    assert DiffusionConfig(base=base, head="dream", mask_token_id=49).mask_token_id == 49


def test_mask_id_outside_vocab_in_checkpoint_raises(llada, tmp_path):
    tiny, _ = llada
    d = _write_llada_dir(tiny, tmp_path / "badmask")
    cfg = json.loads((d / "config.json").read_text())
    cfg["mask_token_id"] = 126336  # LLaDA-8B's id, outside this tiny vocabulary
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        load_llada_dir(d)


def test_unknown_layout_raises(llada, dream, tiny_hf, tmp_path):
    tiny_llama = tiny_hf("llama", tied=False)
    # a plain Llama dir is not LLaDA, a LLaDA dir is not Dream, a plain Llama is neither
    for loader, path in (
        (load_llada_dir, tiny_llama.path),
        (load_dream_dir, llada[1]),
        (load_diffusion_dir, tiny_llama.path),
    ):
        with pytest.raises((WeightFileError, ValueError)) as e:
            loader(path)
        assert "\n" not in str(e.value)
    with pytest.raises(WeightFileError, match="matches no known architecture"):
        load_llada_dir(tiny_llama.path)
    with pytest.raises(WeightFileError, match="not a LLaDA or Dream checkpoint"):
        load_diffusion_dir(tiny_llama.path)
    # random tensor names
    from safetensors.numpy import save_file

    d = tmp_path / "junk"
    d.mkdir()
    save_file({"foo.bar": np.zeros((2, 2), np.float32)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "Dream", "mask_token_id": 1}))
    for loader in (load_llada_dir, load_dream_dir, load_diffusion_dir):
        with pytest.raises(WeightFileError) as e:
            loader(d)
        assert "\n" not in str(e.value)


def test_attn_mask_required_with_cache(llada):
    _, d = llada
    cfg, params = load_llada_dir(d)
    model = DiffusionLM(cfg)
    with pytest.raises(ValueError, match="attn_mask"):
        model.apply(
            params,
            jnp.zeros((1, 2), jnp.int32),
            _pos(1, 2),
            None,
            cache=init_cache(cfg.base, 1, 4),
            cache_index=jnp.zeros((1,), jnp.int32),
        )
    with pytest.raises(ValueError, match="shape"):
        model.apply(params, jnp.zeros((1, 2), jnp.int32), _pos(1, 2), jnp.ones((1, 2, 3), bool))


def test_llada_weight_tying(tiny_hf, tmp_path):
    tiny = tiny_hf("llama", tied=True)
    cfg, params = load_llada_dir(_write_llada_dir(tiny, tmp_path / "tied"))
    assert cfg.base.tie_embeddings and "lm_head" not in params
    tokens = _tokens(5, cfg.vocab_size, cfg.mask_token_id)
    ours, _ = DiffusionLM(cfg).apply(params, jnp.asarray(tokens), _pos(B, T))
    ref = _torch_logits(tiny.model, tokens, np.ones((B, T, T), bool))
    diff = float(np.abs(np.asarray(ours) - ref).max())
    print(f"llada tied: max diff {diff:.2e}")
    assert diff < TOL


# ----------------------------------------------------------------------------- from the CLI


def _with_tokenizer(tiny, d):
    import shutil

    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny.path / f).is_file():
            shutil.copy(tiny.path / f, d / f)
    return d


def test_weights_family_and_cli_on_llada_and_dream_dirs(llada, dream, tmp_path, capsys):
    """``--model hf-directory`` (or its alias ``auto``) ``--weights DIR`` runs the diffusion
    methods on a LLaDA and a Dream directory (family read from ``config.json``), a converted
    jaxspec checkpoint too, and a causal method on them is a one-line error naming both."""
    from models.registry import weights_family
    from scripts import convert as convert_cli
    from scripts import generate as gen_cli

    ld, dd = _with_tokenizer(*llada), _with_tokenizer(*dream)
    assert weights_family(ld) == "dllm" and weights_family(dd) == "dllm"
    assert weights_family(llada[0].path) == "causal"
    native = tmp_path / "llada-js"
    assert convert_cli.main(["--to", "jaxspec", str(ld), str(native)]) == 0
    _with_tokenizer(llada[0], native)
    assert weights_family(native) == "dllm"
    capsys.readouterr()
    for d, method, name in (
        (ld, "stepwise", "hf-directory"),
        (dd, "ssd", "auto"),
        (native, "stepwise", "auto"),
    ):
        rc = gen_cli.main(
            [
                "--model",
                name,
                "--weights",
                str(d),
                "--method",
                method,
                "--gen-length",
                "8",
                "--block-length",
                "4",
                "--prompt",
                "def f(x):",
                "--compare",
                "--quiet",
            ]
        )
        out = capsys.readouterr().out
        # one-token-per-step stepwise is its own reference: --compare says so, runs nothing
        want = "is its own reference" if method == "stepwise" else "outputs: identical"
        assert rc == 0 and want in out, (d, method, out)
    rc = gen_cli.main(
        ["--model", "hf-directory", "--weights", str(ld), "--method", "ngram", "--prompt", "x"]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "needs a causal model" in err and "masked-diffusion" in err, err
