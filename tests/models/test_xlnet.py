"""XLNet (models/xlnet/modeling.py): parity with transformers' XLNetLMHeadModel for both
Fig. 1 masks, mask construction, KV cache identity, loader errors, compact vocabulary."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from models.llama.params import WeightFileError
from models.xlnet.modeling import (
    CompactVocab,
    XLNetLM,
    density_masks,
    init_cache,
    init_params,
    load_hf_xlnet,
    order_to_rank,
    parallel_masks,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4


def _hf_model(seed=0, clamp_len=-1, vocab=61, d_model=32, n_layer=2, n_head=4, d_inner=48):
    torch.manual_seed(seed)
    cfg = transformers.XLNetConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_layer=n_layer,
        n_head=n_head,
        d_inner=d_inner,
        clamp_len=clamp_len,
        dropout=0.0,
        ff_activation="gelu",
        attn_type="bi",
        bi_data=False,
        mem_len=None,
    )
    m = transformers.XLNetLMHeadModel(cfg).eval().float()
    with torch.no_grad():  # perturb LayerNorms and the LM bias so every parameter matters
        for name, prm in m.named_parameters():
            if "layer_norm" in name or name.endswith("lm_loss.bias"):
                prm.add_(0.1 * torch.randn_like(prm))
    return m


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("xlnet_hf")
    m = _hf_model()
    m.save_pretrained(d, safe_serialization=True)
    return d, m


def _sample(seed, B, N, m, V):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, size=(B, N))
    visible = np.zeros((B, N), bool)
    for b in range(B):
        visible[b, rng.permutation(N)[:m]] = True
    return tokens, visible


def _hf_logits(model, tokens, allowed_q, targets=None, token_type_ids=None):
    """transformers logits with perm_mask = not(query-allowed) (the content stream gets the
    diagonal back inside transformers) and target_mapping one-hot on ``targets``."""
    B, N = tokens.shape
    perm = torch.tensor(~np.asarray(allowed_q), dtype=torch.float32)
    kw = {}
    if targets is not None:
        tm = np.zeros((B, targets.shape[1], N), np.float32)
        for b in range(B):
            tm[b, np.arange(targets.shape[1]), targets[b]] = 1.0
        kw["target_mapping"] = torch.tensor(tm)
    if token_type_ids is not None:
        kw["token_type_ids"] = torch.tensor(token_type_ids)
    with torch.no_grad():
        out = model(torch.tensor(tokens), perm_mask=perm, use_mems=False, **kw)
    return out.logits.numpy()


@pytest.mark.parametrize("kind", ["parallel", "density"])
def test_parity_fig1_masks(hf_dir, kind):
    d, hf = hf_dir
    cfg, params = load_hf_xlnet(d)
    model = XLNetLM(cfg)
    B, N, m = 3, 12, 4
    tokens, visible = _sample(1, B, N, m, cfg.vocab_size)
    if kind == "parallel":
        cmask, qmask = parallel_masks(visible)
    else:
        rng = np.random.default_rng(5)
        order = np.stack([rng.permutation(N) for _ in range(B)])  # any order over masked positions
        cmask, qmask = density_masks(visible, order)
    cmask, qmask = np.asarray(cmask), np.asarray(qmask)
    # full query stream (fast relative-shift path) and content stream
    (lq, lc), _ = jax.jit(lambda p, t, c, q: model.apply(p, t, c, q, content_logits=True))(
        params, tokens, cmask, qmask
    )
    targets = np.stack([np.flatnonzero(~visible[b]) for b in range(B)])
    ref_q = _hf_logits(hf, tokens, qmask, targets)
    got_q = np.take_along_axis(np.asarray(lq), targets[:, :, None], axis=1)
    ref_c = _hf_logits(hf, tokens, qmask)  # no target_mapping: the content stream's output
    dq, dc = np.max(np.abs(got_q - ref_q)), np.max(np.abs(np.asarray(lc) - ref_c))
    print(f"{kind}: max|dlogit| query {dq:.2e} content {dc:.2e}")
    assert dq <= TOL and dc <= TOL
    # query slots only at the targets (gather path), as transformers' target_mapping
    sub_q = np.take_along_axis(qmask, targets[:, :, None], axis=1)
    lq2, _ = model.apply(params, tokens, cmask, sub_q, query_pos=targets)
    assert np.max(np.abs(np.asarray(lq2) - ref_q)) <= TOL


def test_parity_segments_and_clamp(tmp_path):
    hf = _hf_model(seed=3, clamp_len=3)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg, params = load_hf_xlnet(tmp_path)
    assert cfg.clamp_len == 3
    B, N = 2, 10
    tokens, visible = _sample(2, B, N, 3, cfg.vocab_size)
    cmask, qmask = (np.asarray(x) for x in density_masks(visible))
    seg = np.zeros((B, N), np.int64)
    seg[:, 6:] = 1
    targets = np.stack([np.flatnonzero(~visible[b]) for b in range(B)])
    ref = _hf_logits(hf, tokens, qmask, targets, token_type_ids=seg)
    lq, _ = XLNetLM(cfg).apply(params, tokens, cmask, qmask, segment_ids=seg)
    got = np.take_along_axis(np.asarray(lq), targets[:, :, None], axis=1)
    assert np.max(np.abs(got - ref)) <= TOL


def test_mask_helpers():
    visible = np.array([[True, False, True, False, False]])
    c, q = (np.asarray(x)[0] for x in parallel_masks(visible))
    assert q[:, [0, 2]].sum() == 5 * 2 - 2 and not q[:, [1, 3, 4]].any()  # 5 rows x 2 minus diag
    assert np.all(np.diag(c)) and not np.any(np.diag(q))
    c, q = (np.asarray(x)[0] for x in density_masks(visible))  # lattice order: masked left to right
    assert q[1].tolist() == [True, False, True, False, False]
    assert q[3].tolist() == [True, True, True, False, False]
    assert q[4].tolist() == [True, True, True, True, False]
    assert q[0].tolist() == [False, False, True, False, False]  # prompt sees the prompt only
    sigma = np.array([[2, 0, 4, 1, 3]])
    rank = np.asarray(order_to_rank(sigma))[0]
    assert rank.tolist() == [1, 3, 0, 4, 2]
    c, q = (np.asarray(x)[0] for x in density_masks(visible, rank[None]))
    assert q[4].tolist() == [True, False, True, False, False]  # 4 comes first among masked
    assert q[3].tolist() == [True, True, True, False, True]


def test_kv_cache_matches_uncached():
    """Appendix F.4: write the prompt's content once, then grow the masked part token by token
    (density order) through the cache; the query logits equal the uncached density pass."""
    from models.xlnet.modeling import XLNetConfig

    cfg = XLNetConfig(vocab_size=37, d_model=32, n_layer=3, n_head=4, d_inner=64)
    params = init_params(cfg, seed=1)
    model = XLNetLM(cfg)
    B, N, m = 2, 10, 3
    tokens, visible = _sample(4, B, N, m, cfg.vocab_size)
    cm, qm = (np.asarray(x) for x in density_masks(visible))
    ref, _ = model.apply(params, tokens, cm, qm)
    ref = np.asarray(ref)
    vis_pos = np.stack([np.flatnonzero(visible[b]) for b in range(B)])
    hid_pos = np.stack([np.flatnonzero(~visible[b]) for b in range(B)])
    cache = init_cache(cfg, B, N)
    take = lambda a, idx: np.take_along_axis(a, idx[:, :, None], axis=1)
    # 1) prompt content only (no query stream)
    _, cache = model.apply(
        params,
        np.take_along_axis(tokens, vis_pos, 1),
        take(cm, vis_pos),
        cache=cache,
        content_pos=vis_pos,
    )
    # 2) query all masked positions from the prompt alone (T = 0 new tokens)
    q0, _ = model.apply(
        params,
        np.zeros((B, 0), np.int32),
        np.zeros((B, 0, N), bool),
        take(qm, hid_pos[:, :1]),
        cache=cache,
        content_pos=np.zeros((B, 0), np.int32),
        query_pos=hid_pos[:, :1],
    )
    err = [np.max(np.abs(np.asarray(q0)[:, 0] - take(ref, hid_pos[:, :1])[:, 0]))]
    # 3) add masked tokens in chunks of 2 (causal) and query those two plus the next position
    #    (a verification pass: each query sees the prompt and the masked tokens before it)
    for s in range(0, hid_pos.shape[1] - 2, 2):
        new = hid_pos[:, s : s + 2]
        nxt = hid_pos[:, s : s + 3]
        lq, cache = model.apply(
            params,
            np.take_along_axis(tokens, new, 1),
            take(cm, new),
            take(qm, nxt),
            cache=cache,
            content_pos=new,
            query_pos=nxt,
        )
        err.append(np.max(np.abs(np.asarray(lq) - take(ref, nxt))))
    print(f"cache: max|dlogit| {max(err):.2e}")
    assert max(err) <= 1e-5, err


def test_loader_errors(tmp_path, hf_dir):
    with pytest.raises(WeightFileError, match="not found"):
        load_hf_xlnet(tmp_path / "nope")
    (tmp_path / "a").mkdir()
    with pytest.raises(WeightFileError, match="config.json"):
        load_hf_xlnet(tmp_path / "a")
    d, _ = hf_dir
    cfg_raw = json.loads((d / "config.json").read_text())
    b = tmp_path / "b"
    b.mkdir()
    (b / "config.json").write_text(json.dumps(cfg_raw))
    with pytest.raises(WeightFileError, match="no model.safetensors"):
        load_hf_xlnet(b)
    (b / "model.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(WeightFileError, match="safetensors") as e:
        load_hf_xlnet(b)
    assert "\n" not in str(e.value)
    cfg_raw["d_inner"] = 50  # shape mismatch against the real tensors
    (b / "config.json").write_text(json.dumps(cfg_raw))
    (b / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    with pytest.raises(WeightFileError, match="has shape"):
        load_hf_xlnet(b)


def test_compact_vocab():
    v = CompactVocab(ids=(5, 2, 9), external_size=12)
    assert v.size == 4 and v.unk == 3
    assert v.encode([2, 5, 9, 0]).tolist() == [1, 0, 2, 3]
    assert v.decode([0, 1, 2, 3]).tolist() == [5, 2, 9, -1]
