"""The one distribution test of the losslessness contract (docs/design.md): do samples of a
sampled decoder follow an exactly enumerated distribution?

Every sampled method is tested the same way: enumerate the exact joint distribution of its
reference on a tiny model (:func:`enumerate_chain` for left-to-right references), draw
``N >= 10^4`` samples from the method under test, and call :func:`check_distribution`
(or :func:`check_groups` for several prompts at once). The rule has three parts and a
sample set passes only if all three hold:

1. **Impossible outcomes.** Any sample on an outcome whose exact probability is 0 (or that
   the enumeration does not list) fails the check. Under the exact distribution this never
   happens, so the part has no false rejections.
2. **Chi-square** goodness of fit over the *possible* outcomes only. Cells whose expected
   count is below ``min_expected`` are pooled (smallest first, into groups each reaching
   ``min_expected``); nothing is dropped: every possible sample lands in some cell. Fails
   when the p-value is below ``alpha``.
3. **Total variation** ``TV = 1/2 sum |f - p|`` (``f`` the empirical frequencies, over every
   outcome, impossible ones included) against the sampling noise floor: the
   ``floor_quantile`` quantile of the TV between ``p`` and the frequencies of ``N``-sample
   multinomial draws from ``p`` itself, simulated (``floor_draws`` draws, a seeded numpy
   Generator, vectorised). Fails when ``TV`` exceeds that quantile. No hand-set slack.

False-rejection rate of correct code: at most ``alpha + (1 - floor_quantile)`` per check
(``2e-3`` with the defaults), up to the chi-square approximation (held by the pooling) and
the Monte-Carlo error of the simulated quantile. The check is deterministic given ``seed``
(the samples themselves come from the seeded decoder under test), so a test is reproducible.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Hashable, Iterable, Mapping, Optional, Sequence

import numpy as np

__all__ = ["DistributionCheck", "check_distribution", "check_groups", "enumerate_chain", "tv_floor"]

_FLOOR_CACHE: dict = {}


def _key(x) -> Hashable:
    """An outcome as a hashable key: sequences (lists, tuples, arrays) become tuples of
    Python ints, scalars become 1-tuples, so ``3``, ``(3,)`` and ``[3]`` are one outcome."""
    if isinstance(x, (list, tuple, np.ndarray)):
        return tuple(int(v) for v in np.asarray(x).reshape(-1))
    if isinstance(x, (int, np.integer)):
        return (int(x),)
    return x


@dataclasses.dataclass(frozen=True)
class DistributionCheck:
    """Result of :func:`check_distribution` / :func:`check_groups`.

    Attributes:
      n: number of samples.
      tv: total-variation distance between the empirical and the exact distribution.
      tv_floor_quantile: the ``floor_quantile`` quantile of the TV of exact ``n``-sample
        draws (the TV threshold).
      p_value: chi-square p-value over the possible outcomes (1.0 when fewer than two
        cells remain after pooling; for groups, the Bonferroni-adjusted smallest one).
      df: chi-square degrees of freedom (cells - 1).
      impossible: samples on zero-probability outcomes.
      passed: all three parts of the rule hold.
      why: a one-line account.
      groups: per-group checks (only from :func:`check_groups`).
    """

    n: int
    tv: float
    tv_floor_quantile: float
    p_value: float
    df: int
    impossible: int
    passed: bool
    why: str
    groups: tuple = ()

    def __str__(self) -> str:
        return self.why


def tv_floor(
    probs: np.ndarray, n: int, *, draws: int = 4000, seed: int = 0, chunk: int = 500
) -> np.ndarray:
    """TVs between ``probs`` and the frequencies of ``draws`` independent ``n``-sample
    multinomial draws from it.

    Args:
      probs: float ``(K,)`` probabilities summing to 1 (zero cells allowed).
      n: samples per draw.
      draws: number of simulated draws.
      seed: seed of the numpy Generator.
      chunk: draws simulated at once (bounds memory at ``chunk * K`` integers).

    Returns: float64 ``(draws,)`` (cached: a mutant suite checks many sample sets against
    one exact distribution).
    """
    probs = np.asarray(probs, np.float64)
    key = (hashlib.sha1(probs.tobytes()).hexdigest(), int(n), int(draws), int(seed))
    if key not in _FLOOR_CACHE:
        rng = np.random.default_rng(seed)
        out = []
        for start in range(0, draws, chunk):
            c = rng.multinomial(n, probs, size=min(chunk, draws - start))
            out.append(0.5 * np.abs(c / n - probs[None]).sum(axis=1))
        if len(_FLOOR_CACHE) >= 64:
            _FLOOR_CACHE.pop(next(iter(_FLOOR_CACHE)))
        _FLOOR_CACHE[key] = np.concatenate(out)
    return _FLOOR_CACHE[key]


def _pooled_cells(obs: np.ndarray, exp: np.ndarray, min_expected: float):
    """Keep cells with expected count >= ``min_expected``; pool the others, smallest first,
    into consecutive groups each reaching ``min_expected`` (a short last group joins the
    previous pool, or the smallest kept cell). Returns pooled ``(obs, exp)``."""
    big = exp >= min_expected
    o, e = list(obs[big]), list(exp[big])
    order = np.argsort(exp[~big], kind="stable")
    so, se = obs[~big][order], exp[~big][order]
    po, pe = [], []
    acc_o = acc_e = 0.0
    for oi, ei in zip(so, se):
        acc_o += oi
        acc_e += ei
        if acc_e >= min_expected:
            po.append(acc_o)
            pe.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        if pe:
            po[-1] += acc_o
            pe[-1] += acc_e
        elif e:
            j = int(np.argmin(e))
            o[j] += acc_o
            e[j] += acc_e
        else:
            po.append(acc_o)
            pe.append(acc_e)
    return np.array(o + po, np.float64), np.array(e + pe, np.float64)


def _default_draws(floor_quantile: float) -> int:
    return max(4000, int(np.ceil(10 / max(1.0 - floor_quantile, 1e-9) - 1e-6)))


def check_distribution(
    samples: Iterable[Any],
    exact: Mapping[Any, float],
    *,
    alpha: float = 1e-3,
    floor_quantile: float = 0.999,
    floor_draws: Optional[int] = None,
    min_expected: float = 5.0,
    seed: int = 0,
) -> DistributionCheck:
    """Test samples against an exact distribution (the rule in the module docstring).

    Args:
      samples: ``N`` outcomes: token sequences (lists, tuples, 1-D arrays; lengths may
        differ, e.g. cut after EOS) or single tokens; a 2-D array is read row by row.
      exact: outcome -> probability, keyed like ``samples``. Its values must sum to 1
        within 1e-3 (they are renormalised); outcomes it lacks have probability 0.
      alpha: chi-square significance level.
      floor_quantile: quantile of the simulated TV noise floor used as the TV threshold.
      floor_draws: number of simulated exact draws for that quantile; default
        ``max(4000, 10 / (1 - floor_quantile))``, about 10 draws beyond the quantile, so
        the threshold's own tail probability is ``1 - floor_quantile`` within about 30%.
      min_expected: expected count below which chi-square cells are pooled.
      seed: seed of the noise-floor simulation.

    Returns:
      :class:`DistributionCheck`.

    Raises:
      ValueError: no samples, or ``exact`` does not sum to 1 (an enumeration bug).
    """
    keys = [_key(s) for s in samples]
    n = len(keys)
    if n == 0:
        raise ValueError("no samples")
    ex: dict = {}
    for k, v in exact.items():
        ex[_key(k)] = ex.get(_key(k), 0.0) + float(v)
    total = sum(ex.values())
    if abs(total - 1.0) > 1e-3:
        raise ValueError(f"exact probabilities sum to {total}, not 1")
    possible = sorted((k for k, v in ex.items() if v > 0), key=lambda k: -ex[k])
    index = {k: i for i, k in enumerate(possible)}
    probs = np.array([ex[k] for k in possible], np.float64) / total
    counts = np.zeros(len(possible), np.int64)
    bad: dict = {}
    for k in keys:
        i = index.get(k)
        if i is None:
            bad[k] = bad.get(k, 0) + 1
        else:
            counts[i] += 1
    impossible = int(sum(bad.values()))
    freq = counts / n
    tv = float(0.5 * (np.abs(freq - probs).sum() + impossible / n))
    draws = floor_draws or _default_draws(floor_quantile)
    floor = float(np.quantile(tv_floor(probs, n, draws=draws, seed=seed), floor_quantile))
    n_ok = int(counts.sum())
    o, e = _pooled_cells(counts.astype(np.float64), probs * n_ok, min_expected)
    if len(o) >= 2 and n_ok > 0:
        from scipy import stats as sps  # test-only dependency

        pval = float(sps.chisquare(o, e * o.sum() / e.sum()).pvalue)
    else:
        pval = 1.0
    df = max(len(o) - 1, 0)
    fails = []
    if impossible:
        worst = max(bad, key=bad.get)
        fails.append(
            f"{impossible} samples on zero-probability outcomes (e.g. {worst} x{bad[worst]})"
        )
    if pval < alpha:
        fails.append(f"chi2 p {pval:.3g} < {alpha:g} (df {df})")
    if tv > floor:
        fails.append(f"TV {tv:.4f} > floor q{floor_quantile:g} {floor:.4f}")
    passed = not fails
    why = (
        (
            f"ok: TV {tv:.4f} <= floor q{floor_quantile:g} {floor:.4f}, chi2 p {pval:.3g} "
            f"(df {df}), 0 impossible, n {n}"
        )
        if passed
        else "FAIL: " + "; ".join(fails) + f" (n {n})"
    )
    return DistributionCheck(
        n=n,
        tv=tv,
        tv_floor_quantile=floor,
        p_value=pval,
        df=df,
        impossible=impossible,
        passed=passed,
        why=why,
    )


def check_groups(
    groups: Sequence[tuple[Iterable[Any], Mapping[Any, float]]],
    *,
    alpha: float = 1e-3,
    floor_quantile: float = 0.999,
    floor_draws: Optional[int] = None,
    seed: int = 0,
    **kw,
) -> DistributionCheck:
    """:func:`check_distribution` on several independent ``(samples, exact)`` groups (e.g.
    one per prompt of a batch) at one overall false-rejection rate: each group is checked at
    ``alpha / G`` and the floor quantile ``1 - (1 - floor_quantile) / G`` (Bonferroni), and
    the groups all pass or the whole check fails.

    Returns:
      :class:`DistributionCheck`: ``n`` and ``impossible`` summed, ``tv`` /
      ``tv_floor_quantile`` of the group with the largest ``tv / floor`` ratio, ``p_value``
      the Bonferroni-adjusted smallest p-value, ``groups`` the per-group checks.
    """
    G = len(groups)
    if G == 0:
        raise ValueError("no groups")
    q = 1.0 - (1.0 - floor_quantile) / G
    res = tuple(
        check_distribution(
            s, e, alpha=alpha / G, floor_quantile=q, floor_draws=floor_draws, seed=seed + i, **kw
        )
        for i, (s, e) in enumerate(groups)
    )
    worst = max(range(G), key=lambda i: res[i].tv / max(res[i].tv_floor_quantile, 1e-12))
    pval = min(1.0, G * min(r.p_value for r in res))
    passed = all(r.passed for r in res)
    failing = [f"group {i}: {r.why}" for i, r in enumerate(res) if not r.passed]
    why = (
        "; ".join(failing)
        if failing
        else f"ok ({G} groups): worst TV {res[worst].tv:.4f} "
        f"<= {res[worst].tv_floor_quantile:.4f}, "
        f"adjusted chi2 p {pval:.3g}, n {sum(r.n for r in res)}"
    )
    return DistributionCheck(
        n=sum(r.n for r in res),
        tv=res[worst].tv,
        tv_floor_quantile=res[worst].tv_floor_quantile,
        p_value=pval,
        df=res[worst].df,
        impossible=sum(r.impossible for r in res),
        passed=passed,
        why=why,
        groups=res,
    )


def enumerate_chain(
    next_logprobs: Callable[[np.ndarray], np.ndarray], n_new: int, *, eos_ids: Sequence[int] = ()
) -> dict[tuple[int, ...], float]:
    """Exact joint distribution of a left-to-right sampler, one batched call per depth.

    Args:
      next_logprobs: ``prefixes int (M, i) -> float (M, V)`` normalised log-probabilities
        of the next token after each prefix (``-inf`` for impossible tokens); called for
        ``i = 0 .. n_new - 1`` with every prefix of positive probability still running.
      n_new: sequence length (the generation budget).
      eos_ids: tokens that end a sequence (kept as its last token).

    Returns:
      ``{tuple of token ids: probability}`` over every outcome of positive probability:
      sequences of length ``n_new``, or shorter ones ending in an EOS token. Zero-probability
      branches are pruned.
    """
    eos = np.asarray(list(eos_ids), np.int64)
    prefixes = np.zeros((1, 0), np.int64)
    logp = np.zeros((1,), np.float64)
    out: dict[tuple[int, ...], float] = {}
    for i in range(n_new):
        lp = logp[:, None] + np.asarray(next_logprobs(prefixes), np.float64)
        rows, toks = np.nonzero(np.isfinite(lp))
        new = np.concatenate([prefixes[rows], toks[:, None]], axis=1)
        new_lp = lp[rows, toks]
        ended = np.isin(toks, eos) | (i == n_new - 1)
        for seq, l in zip(new[ended], new_lp[ended]):
            out[tuple(int(t) for t in seq)] = float(np.exp(l))
        prefixes, logp = new[~ended], new_lp[~ended]
        if len(prefixes) == 0:
            break
    return out
