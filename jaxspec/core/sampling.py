"""Logits processing (temperature, top-k, top-p) and sampling with explicit keys.

The processed distribution is *the* target distribution of the losslessness contract: the
autoregressive reference samples from it, and every speculative verifier uses the same
processed distribution as ``p`` in the acceptance test, so sampling output is
distribution-identical to the reference for any temperature / top-k / top-p setting.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How next-token distributions are formed from logits.

    Attributes:
      temperature: 0 means greedy (argmax); > 0 divides logits before the softmax.
      top_k: keep the k most likely tokens (0 = off).
      top_p: nucleus sampling, keep the smallest set of most likely tokens whose probability
        mass reaches ``top_p`` (1.0 = off). Must lie in (0, 1].

    Raises:
      ValueError: temperature < 0 or not finite, top_k < 0, or top_p outside (0, 1].
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (0.0 <= self.temperature < float("inf")):
            raise ValueError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filter_top_k_top_p(x: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Set the logits outside the top-k / top-p (nucleus) set to ``-inf``.

    Args:
      x: float32 ``(..., V)`` logits (already divided by the temperature, if any).
      top_k: keep the ``top_k`` largest (0 = off). Ties at the k-th value are all kept.
      top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` under
        ``softmax(x)``, and every token at least as likely as its last member (1.0 = off;
        always >= 1 token).

    Returns: float32 ``(..., V)``, same shape. ``top_k``/``top_p`` are Python numbers (static).

    The thresholds come from a bisection over float32 bit patterns on the CPU
    (:func:`kth_largest_key`, :func:`nucleus_key`) and from ``lax.top_k`` / a sort elsewhere
    (:data:`THRESHOLDS_BY_BISECTION`); both keep the same tokens up to float32 rounding of the
    masses at the ``top_p`` boundary (the sort sums them in sorted order).
    """
    V = x.shape[-1]
    bisect = THRESHOLDS_BY_BISECTION
    if bisect is None:
        bisect = jax.default_backend() == "cpu"
    if 0 < top_k < V:
        if bisect:
            x = jnp.where(order_key(x) >= kth_largest_key(x, top_k), x, NEG_INF)
        else:
            x = jnp.where(x >= jax.lax.top_k(x, top_k)[0][..., -1:], x, NEG_INF)
    if top_p < 1.0:
        probs = jax.nn.softmax(x, axis=-1)
        if bisect:
            x = jnp.where(order_key(probs) >= nucleus_key(probs, top_p), x, NEG_INF)
        else:
            sorted_p = jnp.sort(probs, axis=-1)[..., ::-1]
            cum = jnp.cumsum(sorted_p, axis=-1)
            # number of tokens needed to reach mass top_p (at least 1)
            n_keep = jnp.sum(cum - sorted_p < top_p, axis=-1, keepdims=True)
            thresh = jnp.take_along_axis(sorted_p, jnp.maximum(n_keep - 1, 0), axis=-1)
            x = jnp.where(probs >= thresh, x, NEG_INF)
    return x


# How filter_top_k_top_p finds its thresholds: None = by bisection on the CPU and by
# lax.top_k / jnp.sort elsewhere; True / False force one (tests run both). It is read when a
# program is traced: set it before the decoders compile (a compiled program keeps its path).
# The bisection searches the 2^32 float32 bit patterns (32 rounds of one compare-and-reduce
# over V). XLA:CPU's lax.top_k and jnp.sort over V = 49152 cost 8 and 10 ms per row, 70-84 ms
# for a 9-row verification pass (2-core AMD EPYC; the pass itself 70-80 ms), the bisection
# 2.3-2.5 ms (benchmarks/probes/sampling/filter_micro.py). On a GPU a sort is one fast kernel
# and the 32 rounds are 32 launches (not measured there).
THRESHOLDS_BY_BISECTION: "bool | None" = None


def order_key(x: jax.Array) -> jax.Array:
    """uint32 keys of float32 ``x`` in the same order as the values (``-inf`` lowest, ``+inf``
    highest; ``-0.0`` just below ``+0.0``), so a value threshold can be searched bit by bit."""
    b = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where((b >> 31) == 1, ~b, b | jnp.uint32(0x80000000))


def _bisect(lo: jax.Array, hi: jax.Array, ok, upper: bool) -> jax.Array:
    """The largest (``upper``) or smallest key in ``[lo, hi]`` where the monotone predicate
    ``ok`` holds, given that it holds at ``lo`` (``upper``) or at ``hi``; 32 rounds cover
    every uint32 range without overflow."""

    def body(_, c):
        lo, hi = c
        d = hi - lo
        if upper:
            mid = lo + d // 2 + (d & 1)
            good = ok(mid)
            return jnp.where(good, mid, lo), jnp.where(good, hi, mid - jnp.uint32(1))
        mid = lo + d // 2
        good = ok(mid)
        return jnp.where(good, lo, mid + jnp.uint32(1)), jnp.where(good, mid, hi)

    lo, hi = jax.lax.fori_loop(0, 32, body, (lo, hi))
    return lo if upper else hi


def kth_largest_key(x: jax.Array, k: int) -> jax.Array:
    """:func:`order_key` of the ``k``-th largest value of ``x (..., V)`` along the last axis,
    ties counted (``lax.top_k(x, k)[0][..., -1]``), as uint32 ``(..., 1)``: the largest key
    ``t`` with ``#{x >= t} >= k``."""
    key = order_key(x)
    return _bisect(
        jnp.min(key, axis=-1, keepdims=True),
        jnp.max(key, axis=-1, keepdims=True),
        lambda t: jnp.sum(key >= t, axis=-1, keepdims=True) >= k,
        upper=True,
    )


def nucleus_key(probs: jax.Array, top_p: float) -> jax.Array:
    """:func:`order_key` of the top-p threshold of ``probs (..., V)`` (non-negative), uint32
    ``(..., 1)``: the smallest ``t`` with ``sum(probs[probs > t]) < top_p``. ``probs >= t``
    is then the smallest set of most likely tokens whose mass reaches ``top_p`` plus every
    token tied with its last member: the tokens of a descending sort whose preceding mass is
    below ``top_p``, never empty (the largest value always qualifies)."""
    key = order_key(probs)
    return _bisect(
        jnp.zeros(key.shape[:-1] + (1,), jnp.uint32),
        jnp.max(key, axis=-1, keepdims=True),
        lambda t: jnp.sum(jnp.where(key > t, probs, 0.0), axis=-1, keepdims=True) < top_p,
        upper=False,
    )


def process_logits(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Apply temperature, top-k and top-p; return log-probabilities.

    Args:
      logits: float ``(..., V)``.
      cfg: sampling configuration; must not be greedy.

    Returns:
      float32 ``(..., V)`` normalised log-probabilities, ``-inf`` on removed tokens.
      Top-k ties at the k-th value are all kept; top-p keeps every token whose probability
      is at least that of the last token needed to reach mass ``top_p`` (always >= 1 token).
    """
    if cfg.greedy:
        raise ValueError("process_logits is for temperature > 0; use argmax for greedy decoding")
    x = filter_top_k_top_p(logits.astype(jnp.float32) / cfg.temperature, cfg.top_k, cfg.top_p)
    return jax.nn.log_softmax(x, axis=-1)


def target_probs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Processed next-token probabilities ``(..., V)`` (float32) for temperature > 0."""
    return jnp.exp(process_logits(logits, cfg))


# argmax reduces at most this many elements (2M) in one piece: XLA:CPU materializes two
# temporaries of the input's size, and from about 4M elements (16 MB) on a call ran 4-5x slower
ARGMAX_PIECE = 1 << 21


def argmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``jnp.argmax(x, axis)`` as int32, computed as two vectorizable reductions.

    The result is ``jnp.argmax``'s, index for index: the first position of the maximum along
    ``axis`` (ties go to the lower index), the first NaN where the slice holds one (``argmax``
    counts NaN as the maximum), 0 for a slice of ``-inf``. Every greedy decoder here (AR and
    n-gram steps, the chain verifier, SPS / SPACE / DiffuSpec drafts, ASSD, the
    masked-diffusion reference step) picks its tokens with it.

    Why: XLA:CPU (jaxlib 0.10.2) lowers ``argmax`` to a variadic (value, index) reduction that
    it runs as a scalar loop. Here the max is one reduction and the first index holding it
    (or a NaN) a float32 min-reduction, both vectorized: over ``(1, 32, 49152)`` float32
    logits (one masked-diffusion block) 3.6 ms for ``jnp.argmax`` against 0.7 ms, medians on a
    2-core AMD EPYC (``results/argmax/micro.md``; the dual-cache dLLM loop ran 1.04x faster,
    ``ab_argmax.md``). Arrays over :data:`ARGMAX_PIECE` elements are reduced in pieces of
    whole slices. On other backends (GPU, TPU; not measured there) it is ``jnp.argmax``.

    Args:
      x: array ``(..., N, ...)`` of any real dtype.
      axis: the axis to reduce.

    Returns:
      int32 array of ``x.shape`` without ``axis``.

    Raises:
      ValueError: ``x`` is a scalar, ``axis`` is out of range or the axis is empty.
    """
    x = jnp.asarray(x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim or x.shape[axis] == 0:
        raise ValueError(
            f"argmax: axis {axis} out of range or empty for an array of shape {x.shape}"
        )
    if jax.default_backend() != "cpu":
        return jnp.argmax(x, axis=axis).astype(jnp.int32)
    x = jnp.moveaxis(x, axis, -1)
    lead, n = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, n)
    per = max(1, ARGMAX_PIECE // n)
    pieces = [_first_max(rows[i : i + per]) for i in range(0, rows.shape[0], per)]
    return (pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces)).reshape(lead)


def _first_max(x: jax.Array) -> jax.Array:
    """:func:`argmax` of ``x (R, N)`` along its last axis, in one piece: int32 ``(R,)``."""
    n = x.shape[-1]
    # float32 keys (exact integers below 2**24): XLA:CPU turns an int32 min-reduction into a
    # chain of reduce-windows over a materialized array, 5x slower at (32, 151936)
    dtype = jnp.float32 if 2 * n < 2**24 else jnp.int32
    index = jax.lax.broadcasted_iota(dtype, x.shape, 1)
    # key: a NaN's index, else n + the index of a value equal to the max (XLA:CPU's max need
    # not propagate NaN), else 2n; the smallest key wins
    key = jnp.where(x == jnp.max(x, axis=-1, keepdims=True), index + n, 2 * n)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        key = jnp.where(jnp.isnan(x), index, key)
    first = jnp.min(key, axis=-1)
    return jnp.where(first < n, first, first - n).astype(jnp.int32)


def sample_from_logits(key: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Draw one token per row.

    Args:
      key: PRNG key.
      logits: float ``(..., V)``.
    Returns:
      int32 ``(...)``: argmax when ``cfg.greedy`` else a sample from the processed
      distribution.
    """
    if cfg.greedy:
        return argmax(logits)
    return jax.random.categorical(key, process_logits(logits, cfg), axis=-1).astype(jnp.int32)


def sample_from_probs(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draw one token per row from (possibly unnormalised, non-negative) ``probs (..., V)``."""
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)
