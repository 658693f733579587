"""``jaxspec.core.sampling.argmax`` returns ``jnp.argmax``'s indices, jitted and not, on the
inputs greedy decoding meets: ties, ``-inf`` slices, NaN, other axes, low-precision floats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.core import sampling
from jaxspec.core.sampling import SamplingConfig, argmax, sample_from_logits


def _reference(x, axis):
    return np.asarray(jnp.argmax(x, axis=axis)).astype(np.int32)


def _cases():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 9, 4099)).astype(np.float32) * 4
    ties = rng.integers(0, 3, size=(4, 7, 33)).astype(np.float32)  # many equal maxima
    masked = logits.copy()
    masked[0, 2] = -np.inf  # a slice of -inf
    masked[1, :, :100] = -np.inf
    nan = logits.copy()
    nan[0, 1, 17] = np.nan  # first NaN wins
    nan[0, 1, 3000] = np.nan
    nan[2, 5, 4098] = np.nan
    nan[1, 0, :] = np.nan
    return {
        "logits": logits,
        "ties": ties,
        "masked": masked,
        "nan": nan,
        "bf16 ties": jnp.asarray(ties, jnp.bfloat16),
        "bf16 logits": jnp.asarray(logits, jnp.bfloat16),
        "int": rng.integers(-5, 5, size=(5, 64)).astype(np.int32),
    }


@pytest.mark.parametrize("name", list(_cases()))
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_argmax_is_jnp_argmax(name, axis):
    x = _cases()[name]
    want = _reference(x, axis)
    got = argmax(x, axis)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(argmax, static_argnums=1)(x, axis)), want)


@pytest.mark.parametrize("name", ["ties", "nan", "bf16 logits"])
def test_argmax_in_pieces_is_jnp_argmax(name, monkeypatch):
    """Arrays over ARGMAX_PIECE elements are reduced a few slices at a time (here 1-3 slices
    per piece, so the last piece is shorter)."""
    x = _cases()[name]
    for piece in (x.shape[-1], 3 * x.shape[-1] - 1, 100):
        monkeypatch.setattr(sampling, "ARGMAX_PIECE", piece)
        for axis in (-1, 0):
            np.testing.assert_array_equal(np.asarray(argmax(x, axis)), _reference(x, axis))


def test_argmax_off_the_cpu_is_jnp_argmax(monkeypatch):
    """GPU / TPU keep jnp.argmax (the two-reduction form was measured on XLA:CPU only)."""
    x, seen = _cases()["ties"], []
    want = _reference(x, 1)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jnp, "argmax", lambda x, axis: seen.append(axis) or np.argmax(x, axis))
    np.testing.assert_array_equal(np.asarray(argmax(x, 1)), want)
    assert seen == [1]


def test_argmax_picks_the_first_of_tied_maxima():
    x = jnp.asarray([[0.0, 2.0, 1.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-jnp.inf] * 4])
    np.testing.assert_array_equal(np.asarray(argmax(x)), [1, 0, 0])


def test_greedy_sampling_uses_it():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 300)), jnp.float32)
    got = sample_from_logits(jax.random.PRNGKey(0), x, SamplingConfig())
    np.testing.assert_array_equal(np.asarray(got), _reference(x, -1))


@pytest.mark.parametrize("axis", [2, -3])
def test_argmax_rejects_a_bad_axis(axis):
    with pytest.raises(ValueError, match="axis"):
        argmax(jnp.zeros((2, 3)), axis)
    with pytest.raises(ValueError, match="axis"):
        argmax(jnp.float32(1.0))
    with pytest.raises(ValueError, match="empty"):
        argmax(jnp.zeros((2, 0)))
