"""Fast checks of jaxspec.eval.quality on a tiny random model and hand-made inputs."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.eval import quality as Q
from jaxspec.testing.tiny import tiny_model
from models.diffusion.modeling import DiffusionConfig, DiffusionLM


def test_mask_positions_never_position_zero():
    for seed in range(5):
        m = Q.mask_positions(20, 0.5, np.random.default_rng(seed))
        assert not m[0] and m.sum() == round(0.5 * 19)
    assert Q.mask_positions(10, 0.01, np.random.default_rng(0)).sum() == 1
    with pytest.raises(Q.QualityError):
        Q.mask_positions(10, 0.0, np.random.default_rng(0))


@pytest.mark.parametrize("head", ["dream", "llada"])
def test_masked_accuracy_matches_manual(head):
    causal, params = tiny_model(vocab=32, seed=1)
    mask_id = 31
    model = DiffusionLM(DiffusionConfig(base=causal.config, head=head, mask_token_id=mask_id))
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 31, size=(3, 12)).astype(np.int32)
    out, masks = Q.masked_accuracy(
        model, params, rows, 0.5, seed=3, batch_size=2, return_masks=True
    )
    assert not masks[:, 0].any() and out["masked"] == masks.sum()
    # manual oracle: logits[:, i] predicts token i (the shift is inside DiffusionLM.apply)
    noisy = np.where(masks, mask_id, rows)
    pos = jnp.broadcast_to(jnp.arange(12), noisy.shape)
    logits, _ = model.apply(params, jnp.asarray(noisy), pos)
    logits = np.array(logits)
    logits[..., mask_id] = -np.inf
    pred = logits.argmax(-1)
    assert out["correct"] == int(((pred == rows) & masks).sum())
    # same seed -> same masks and figure
    again = Q.masked_accuracy(model, params, rows, 0.5, seed=3)
    assert again == out

    # Rows whose masked tokens equal the model's own predictions score 1.0.
    fixed = np.where(masks, pred, rows).astype(np.int32)
    # predictions depend only on the unmasked context, which is unchanged
    assert Q.masked_accuracy(model, params, fixed, 0.5, seed=3)["accuracy"] == 1.0


def test_causal_accuracy_at_positions():
    causal, params = tiny_model(vocab=32, seed=2)
    rows = np.zeros((1, 8), np.int32)
    masks = np.zeros((1, 8), bool)
    masks[0, 3] = True
    from jaxspec.causal.decode import generate

    # greedy continuation of [0,0,0] gives the model's own next token -> accuracy 1
    nxt = generate(causal, params, [[0, 0, 0]], max_new_tokens=1).tokens[0][0]
    rows[0, 3] = nxt
    assert Q.causal_accuracy_at(causal, params, rows, masks)["accuracy"] == 1.0
    with pytest.raises(Q.QualityError):
        Q.causal_accuracy_at(causal, params, rows, np.ones((1, 8), bool))


def test_continuation_match_and_figures():
    assert Q.continuation_match([1, 2, 3, 4], [1, 2, 0, 4]) == 0.75
    assert Q.continuation_match([1, 2], [1, 2, 3, 4]) == 0.5
    assert Q.continuation_match([5, 1, 2, 3], [1, 2, 3, 4]) == 0.0  # positional, not shifted
    with pytest.raises(Q.QualityError):
        Q.continuation_match([1], [])
    assert Q.is_degenerate([7] * 6 + [1, 2]) and not Q.is_degenerate([7] * 4 + [1, 2, 3, 4])
    figs = Q.completion_figures([[7] * 8, [1, 2, 3, 4, 5, 6, 7, 8]], [[7] * 8, [1, 2, 3, 0] * 2])
    assert figs["continuation_match"] == round((1.0 + 3 / 8) / 2, 4)
    assert figs["degenerate_share"] == 0.5 and figs["longest_run"] == 8


class _Tok:
    def encode(self, text):
        return [ord(c) % 97 for c in text]


def test_heldout_snippets_deterministic(tmp_path):
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("a" * 50 + "b" * 50)
    (tmp_path / "csv.py").write_text("c" * 30)
    (tmp_path / "other.py").write_text("z" * 100)
    s = Q.heldout_snippets(_Tok(), ["json", "csv"], 3, prompt_len=6, cont_len=4, root=tmp_path)
    assert [x.source for x in s] == ["csv.py", "json/__init__.py", "json/__init__.py"]
    assert all(len(x.prompt) == 6 and len(x.target) == 4 for x in s)
    assert s == Q.heldout_snippets(
        _Tok(), ["json", "csv"], 3, prompt_len=6, cont_len=4, root=tmp_path
    )
    with pytest.raises(Q.QualityError):
        Q.heldout_snippets(_Tok(), ["json", "csv"], 50, prompt_len=6, cont_len=4, root=tmp_path)
