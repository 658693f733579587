"""Drafting across vocabularies (:mod:`jaxspec.causal.hetero`, DiffuSpec App. E): a tiny Dream
drafter whose tokenizer segments text differently from the target's (another id order and a
two-letter token) drafts for a tiny causal target.

* :func:`translate_draft` re-segments the context/draft boundary as the target would;
* greedy output is identical to AR greedy decoding (padded batch, EOS);
* sampled output has the AR distribution (exact enumeration, 5,000 samples per prompt), and
  the negative control that resamples from ``p`` after a rejection is rejected;
* the registry runs it when ``vocab_adapter`` is set.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxspec.causal.hetero as hetero
from jaxspec.causal.decode import generate
from jaxspec.causal.diffuspec import DiffusionDrafter
from jaxspec.causal.hetero import hetero_generate, translate_draft
from jaxspec.core.sampling import SamplingConfig
from jaxspec.testing.distribution import check_groups
from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model
from tests.causal.test_decode import _exact_joint

V, EOS, N_NEW, N = 6, 5, 5, 10_000
CFG = SamplingConfig(temperature=0.8, top_k=4)


class LetterTok:
    """Greedy longest-match tokenizer over a fixed piece list (id = index)."""

    def __init__(self, pieces):
        self.pieces = list(pieces)
        self.vocab_size = len(self.pieces)

    def encode(self, text):
        out, i = [], 0
        while i < len(text):
            j = max(
                (j for j, p in enumerate(self.pieces) if p and text.startswith(p, i)),
                key=lambda j: len(self.pieces[j]),
            )
            out.append(j)
            i += len(self.pieces[j])
        return out

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


TARGET_TOK = LetterTok(["a", "b", "c", "d", "e", "$"])  # EOS = "$" (id 5)
DRAFT_TOK = LetterTok(["e", "d", "c", "b", "a", "ab", "$", "ca", ""])  # 8 = [MASK]
PROMPTS = ([0, 1, 2, 0, 1, 2, 0], [3, 4, 1, 0])


def _pair(seed=7):
    model, params = tiny_model(V, seed=seed, scale=6.0)
    dmodel, dparams = tiny_diffusion_model("dream", vocab=9, ctx=128, seed=2)
    # the lattice's EOS is the mask id (never drafted), so drafts run their full length
    drafter = DiffusionDrafter(dmodel, 3, eos_id=8, k_min=2, cps=True, adl=True, m_max=3)
    return model, params, drafter, (dparams, None)


def test_translate_draft_resegments_the_boundary():
    # the drafter's "ab" is two target ids; "$" ends the draft text at the drafter's EOS
    assert translate_draft(TARGET_TOK, DRAFT_TOK, [2], [5, 7, 6, 4], 4, drafter_eos=6) == [
        0,
        1,
        2,
        0,
    ]
    assert translate_draft(TARGET_TOK, DRAFT_TOK, [2], [5, 7], 2) == [0, 1]  # cut at k
    # a target tokenizer that merges across the boundary ("c" + "a" -> "ca"): the context's
    # last id is re-segmented, so the draft falls back to the draft text alone
    merging = LetterTok(["a", "b", "c", "ca"])
    assert translate_draft(merging, DRAFT_TOK, [2], [4], 3) == [0]
    assert translate_draft(TARGET_TOK, DRAFT_TOK, [2], [], 3) == []


def test_greedy_identical_to_ar():
    model, params, drafter, dparams = _pair()
    prompts = [list(p) for p in PROMPTS]
    for eos in ((EOS,), ()):  # rows that end early, and rows that run the whole budget
        ar = generate(model, params, prompts, max_new_tokens=12, eos_ids=eos)
        res = hetero_generate(
            model,
            params,
            prompts,
            drafter=drafter,
            drafter_params=dparams,
            target_tokenizer=TARGET_TOK,
            drafter_tokenizer=DRAFT_TOK,
            max_new_tokens=12,
            eos_ids=eos,
        )
        assert res.tokens == ar.tokens
    assert res.tokens == ar.tokens
    s = res.stats
    assert s.method == "diffuspec-hetero" and s.reference == "ar"
    assert (s.draft_nfe == s.steps).all() and s.drafts_proposed.sum() > 0


@pytest.fixture(scope="module")
def exact():
    model, params, _, _ = _pair()
    return [_exact_joint(model, params, list(p), N_NEW, CFG, eos=(EOS,)) for p in PROMPTS]


def _sampled(n: int = N):
    model, params, drafter, dparams = _pair()
    res = hetero_generate(
        model,
        params,
        [list(p) for p in PROMPTS for _ in range(n)],
        drafter=drafter,
        drafter_params=dparams,
        target_tokenizer=TARGET_TOK,
        drafter_tokenizer=DRAFT_TOK,
        max_new_tokens=N_NEW,
        sampling=CFG,
        seed=11,
        eos_ids=(EOS,),
    )
    return res


@pytest.mark.optimised  # 5,000 sampled rows per prompt: run-time-bound
def test_sampled_distribution_equals_ar(exact):
    n = N // 2  # 5,000 per prompt (116 s at 10^4 in make test); the false-rejection rate is alpha's
    res = _sampled(n)
    chk = check_groups([(res.tokens[i * n : (i + 1) * n], ex) for i, ex in enumerate(exact)])
    assert chk.passed, chk.why
    s = res.stats
    assert 0.05 < s.accepted_drafts / s.drafts_proposed.sum() < 0.95  # accepts and rejects


@pytest.mark.slow  # the test's power (30 s): make test-all; the exact test above stays
@pytest.mark.optimised  # 10^4 sampled rows: run-time-bound
def test_negative_control_resampling_from_p_is_rejected(exact, monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class FromP(hetero.ExternalDrafts):
        resample: str = "target"

    monkeypatch.setattr(hetero, "ExternalDrafts", FromP)
    n = 3000  # the wrong rule is far off: a third of the samples rejects it (chi2, TV)
    res = _sampled(n)
    chk = check_groups([(res.tokens[i * n : (i + 1) * n], ex) for i, ex in enumerate(exact)])
    assert not chk.passed, chk


def test_registry_runs_the_adapter():
    from jaxspec.methods import get_method

    model, params, drafter, (dp, _) = _pair()
    opts = dict(
        max_new_tokens=10,
        draft_length=3,
        k_min=2,
        eos_id=8,
        dllm_drafter=(drafter.model, dp),
        vocab_adapter=(TARGET_TOK, DRAFT_TOK),
    )
    m = get_method("diffuspec")
    res = m.run(model, params, [list(PROMPTS[0])], m.configure(opts))
    ar = get_method("ar").run(
        model, params, [list(PROMPTS[0])], get_method("ar").configure(max_new_tokens=10)
    )
    assert res.stats.method == "diffuspec-hetero" and res.tokens == ar.tokens
    assert np.asarray(res.stats.target_nfe).sum() <= np.asarray(ar.stats.target_nfe).sum()
