"""Answer-token accounting of the diffusion suites (:mod:`jaxspec.bench.answers`): the answer
NFE equals what the transfer order says, for the reference decoders and for SSD / Spiffy's
per-forward record; the quality flag fires on EOS-heavy and looping answers and not on clean
ones; the reports put the answer-based columns first; the prompt sets alternate their two
sources."""

from __future__ import annotations

import numpy as np
import pytest

from jaxspec.bench import answers as ans
from jaxspec.bench.records import BenchError, BenchPrompt
from jaxspec.dllm import (
    DiffusionDecodeConfig,
    SpiffyConfig,
    SSDConfig,
    diffusion_generate,
    spiffy_generate,
    ssd_generate,
)
from jaxspec.dllm.spiffy import DraftGraph
from jaxspec.eval.quality import answer_flags, answer_quality
from jaxspec.testing.tiny import tiny_diffusion_model

G, L = 16, 8
PROMPT = [5, 6, 7, 8, 9, 10, 11]
LLADA = tiny_diffusion_model("llada", vocab=40)
DREAM = tiny_diffusion_model("dream", vocab=40)
GRAPH = DraftGraph((((1, 1),), ((1, 2),), ((1, 1), (2, 1)), ((1, 1), (2, 2))))


def _complete_after(order_steps: np.ndarray, n: int) -> int:
    """Independent of :func:`answers.answer_nfe`: replay the commits step by step (positions
    in transfer order) and return the number of steps after which positions ``0 .. n - 1``
    are all committed."""
    done: set = set()
    for k, step in enumerate(sorted(set(order_steps.tolist()))):
        done |= set(np.flatnonzero(order_steps == step).tolist())
        if set(range(n)) <= done:
            return k + 1
    raise AssertionError("answer never complete")


def _eos_choices(tokens: np.ndarray) -> list[tuple[int, int]]:
    """``(eos id, answer length)`` for every distinct token taken as the EOS: the answer ends at
    its first occurrence (decoding does not depend on ``eos_ids`` without the EOS options)."""
    return [(int(t), int(np.flatnonzero(tokens == t)[0]) + 1) for t in np.unique(tokens)]


@pytest.mark.parametrize(
    "model,kw",
    [
        (LLADA, {}),
        (LLADA, {"cache": "dual"}),
        (DREAM, {"cache": "dual"}),
        (LLADA, {"cfg_scale": 1.0}),
    ],
    ids=["llada-none", "llada-dual", "dream-dual", "llada-cfg"],
)
def test_stepwise_answer_nfe_is_the_step_that_completes_the_answer(model, kw):
    """One token per step: the answer NFE is the number of steps until every answer position
    (through the EOS) is committed, times the forwards per step (2 with CFG)."""
    m, p = model
    res = diffusion_generate(m, p, [PROMPT], DiffusionDecodeConfig(G, L, G, **kw))
    ts, toks = res.transfer_step[0], res.full_tokens[0]
    assert sorted(ts.tolist()) == list(range(G))  # one token per step
    per_step = 2 if kw.get("cfg_scale") else 1
    seen = set()
    for eos, n in _eos_choices(toks):
        a = ans.diffusion_answer(res, [eos])
        assert a.length == n and len(a.answer) == n - 1
        assert a.nfe == per_step * _complete_after(ts, n)
        assert a.seconds == pytest.approx(res.run_s * a.nfe / int(res.stats.target_nfe[0]))
        seen.add(a.nfe)
    assert len(seen) > 1  # the EOS choice matters
    a = ans.diffusion_answer(res, [])  # no EOS: the whole budget
    assert a.length == G and a.nfe == int(res.stats.target_nfe[0])


def test_threshold_answer_nfe_counts_steps_not_positions():
    """Several positions per step: the answer is complete at the step that commits its last
    position; steps that committed only tail positions before it still count."""
    m, p = LLADA
    res = diffusion_generate(m, p, [PROMPT], DiffusionDecodeConfig(G, L, G, threshold=0.3))
    ts, toks = res.transfer_step[0], res.full_tokens[0]
    assert int(res.stats.steps[0]) < G  # parallel: fewer steps than positions
    for eos, n in _eos_choices(toks):
        assert ans.diffusion_answer(res, [eos]).nfe == _complete_after(ts, n)


def test_speculative_answer_nfe_from_the_per_forward_record():
    """SSD and Spiffy: the ``steps_by_nfe`` record agrees with the acceptance histogram, the
    outputs and transfer order equal the stepwise reference's, and the answer NFE is the
    forward after which the answer's last reference step was taken (replayed here forward by
    forward); never more than the reference's, and the whole run without an EOS."""
    m, p = DREAM
    d = DiffusionDecodeConfig(G, L, G, cache="dual")  # the papers' setting
    ref = diffusion_generate(m, p, [PROMPT], d)
    for res in (
        ssd_generate(m, p, [PROMPT], SSDConfig(d, 3, "chain")),
        spiffy_generate(m, p, [PROMPT], SpiffyConfig(d, GRAPH)),
    ):
        nfe = int(res.stats.target_nfe[0])
        log = res.steps_by_nfe[0][:nfe]
        assert log[-1] == G and (np.diff(np.r_[0, log]) >= 1).all()
        assert (res.steps_by_nfe[0][nfe:] == 0).all()
        if res.stats.method == "ssd":  # accept_hist[j] = forwards that took j steps
            hist = np.bincount(np.diff(np.r_[0, log]), minlength=res.stats.accept_hist.shape[1])
            np.testing.assert_array_equal(hist, res.stats.accept_hist[0])
        np.testing.assert_array_equal(res.full_tokens, ref.full_tokens)
        np.testing.assert_array_equal(res.transfer_step, ref.transfer_step)
        # forward i commits the positions whose reference step lies in [log[i-1], log[i])
        fwd_of_pos = np.searchsorted(log, res.transfer_step[0], side="right")
        for eos, n in _eos_choices(res.full_tokens[0]):
            a = ans.diffusion_answer(res, [eos])
            assert a.nfe == _complete_after(fwd_of_pos, n)
            assert a.nfe <= ans.diffusion_answer(ref, [eos]).nfe
        assert ans.diffusion_answer(res, []).nfe == nfe


def test_spiffy_without_drafts_matches_the_reference_answer_nfe():
    """D = 0: one reference step per forward, so the answer NFE equals the reference's."""
    m, p = LLADA
    d = DiffusionDecodeConfig(G, L, G, cache="dual")
    ref = diffusion_generate(m, p, [PROMPT], d)
    res = spiffy_generate(m, p, [PROMPT], SpiffyConfig(d, DraftGraph(())))
    for eos, _ in _eos_choices(ref.full_tokens[0]):
        assert ans.diffusion_answer(res, [eos]).nfe == ans.diffusion_answer(ref, [eos]).nfe


def test_answer_accounting_bad_input():
    m, p = DREAM
    d = DiffusionDecodeConfig(G, L, G)
    res = ssd_generate(m, p, [PROMPT], SSDConfig(d, 3, "chain"))
    res.steps_by_nfe = None
    with pytest.raises(BenchError, match="steps_by_nfe"):
        ans.diffusion_answer(res, [0])
    with pytest.raises(ValueError, match="answer length 0"):
        ans.answer_nfe(np.arange(4), 0, nfe=4, steps=4)
    with pytest.raises(ValueError, match="never committed"):
        ans.answer_nfe(np.array([0, -1, 2]), 3, nfe=3, steps=3)
    with pytest.raises(ValueError, match="record ends"):
        ans.answer_nfe(np.array([0, 5]), 2, nfe=2, steps=6, steps_by_nfe=np.array([2, 4]))


def test_causal_answer_and_row_figures():
    """A causal decode stops at the EOS: every forward is an answer forward. Row figures:
    sums for tokens/NFE, medians for tokens/s, reference ratios for the speedups."""
    a = ans.causal_answer([4, 5, 6, 2], [2], nfe=3, seconds=0.5, draft_nfe=6)
    assert (a.length, a.answer, a.nfe, a.draft_nfe) == (4, (4, 5, 6), 3, 6)
    b = ans.causal_answer([4, 5], [2], nfe=2, seconds=0.25)  # budget reached, no EOS
    assert (b.length, b.answer) == (2, (4, 5))
    fig = ans.answer_figures([a, b], draft=True)
    assert fig["answer_tokens_per_nfe"] == pytest.approx(6 / 5)
    assert fig["answer_tokens_per_draft_nfe"] == pytest.approx(1.0)
    assert fig["answer_tokens_per_s"] == pytest.approx(8.0)  # median of 8 and 8
    slow = [
        ans.causal_answer([4, 5, 6, 2], [2], nfe=6, seconds=1.0),
        ans.causal_answer([4, 5], [2], nfe=4, seconds=1.0),
    ]
    sp = ans.answer_speedups([a, b], slow)
    assert sp["answer_nfe_speedup"] == pytest.approx(2.0)
    assert sp["answer_step_reduction"] == pytest.approx(0.5)
    assert sp["answer_speedup"] == pytest.approx(3.0)  # median of 2 and 4


# ----------------------------------------------------------------------------- the flag

CLEAN = list(range(3, 43))  # 40 distinct tokens
LOOP = [5, 6, 7, 8] * 12  # a 4-token loop
SHORT = [9, 10, 11, 12, 13]  # an answer of 5 tokens, then EOS padding


def test_flag_fires_for_eos_heavy_and_looping_answers_only():
    assert answer_quality([CLEAN, CLEAN[::-1]])["answer_flags"] == []
    assert answer_quality([LOOP, LOOP])["answer_flags"] == ["loop"]
    assert answer_quality([SHORT, SHORT, CLEAN])["answer_flags"] == ["EOS"]
    assert answer_quality([SHORT[:2] * 3] * 3)["answer_flags"] == ["EOS", "loop"]
    assert answer_quality([[], []])["answer_flags"] == ["EOS"]  # empty: no loop figures
    assert answer_flags(40, 0.21, 0.9) == ["loop"] and answer_flags(40, 0.1, 0.39) == ["loop"]
    assert answer_flags(31.5, 0.0, 1.0) == ["EOS"] and answer_flags(32, 0.2, 0.4) == []
    eos = 2
    runs = [
        ans.causal_answer(t + [eos], [eos], nfe=len(t) + 1, seconds=1.0) for t in (CLEAN, CLEAN)
    ]
    assert ans.row_quality(runs)["answer_flag"] is None
    runs = [ans.causal_answer(LOOP + [eos], [eos], nfe=1, seconds=1.0)] * 2
    assert ans.row_quality(runs)["answer_flag"] == "loop"


def _ssd_result(flag_rule=None):
    from jaxspec.bench.ssd import run_ssd_suite

    m, p = DREAM
    return run_ssd_suite(
        m,
        p,
        [BenchPrompt("t/0", PROMPT)],
        model_name="tiny-dream",
        gen_length=G,
        block_length=L,
        rows=[(3, "chain", "dual")],
        eos_ids=(0,),
        progress=False,
        limit_analysis=False,
        prompt_set="long",
        flag_rule=flag_rule,
    )


def test_ssd_report_flags_rows_and_leads_with_answer_columns():
    """The tiny model's answers (at most 16 tokens) are below the EOS rule's 32: the report
    says so in one header line and marks the speed figures; with a rule the answers pass, the
    report has neither. The answer-based columns come before the EOS-padded ones."""
    from jaxspec.bench.ssd import markdown_report

    res = _ssd_result()
    assert all(r["answer_flag"] and "EOS" in r["answer_flag"] for r in res["rows"])
    assert all(r["prompt_set"] == "long" for r in res["rows"]) and res["prompt_set"] == "long"
    text = markdown_report(res)
    head = text.split("| method")[0]
    assert head.count("**Bad input:") == 1 and "mostly EOS" in head
    assert "Prompt set: `long`" in head
    assert ans.FLAG_MARK in text
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:12] == [
        "method",
        "N",
        "tree",
        "nodes",
        "cache",
        "set",
        "answer len",
        "answer NFE",
        "answer tok/NFE",
        "answer tok/s",
        "answer Step↓",
        "answer NFE speedup",
    ]
    assert (
        cols.index("answer wall speedup")
        < cols.index("flag")
        < cols.index("NFE")
        < cols.index("Step↓")
        < cols.index("wall speedup")
    )
    ssd = next(r for r in res["rows"] if r["method"] == "ssd")
    ref = next(r for r in res["rows"] if r["method"] == "stepwise")
    assert ssd["answer_nfe"] <= ref["answer_nfe"] and ssd["identical_to_reference"]
    assert ssd["answer_step_reduction"] == pytest.approx(
        1 - ssd["answer_nfe"] / ref["answer_nfe"], abs=1e-3
    )
    quiet = _ssd_result(
        {"median_answer_min": 0, "repeated_ngram_rate_max": 1.0, "distinct_token_share_min": 0.0}
    )
    text = markdown_report(quiet)
    assert all(r["answer_flag"] is None for r in quiet["rows"])
    assert "Bad input" not in text and ans.FLAG_MARK not in text


def test_dllm_and_spiffy_reports_lead_with_answer_columns():
    from jaxspec.bench.dllm import markdown_report as dllm_report
    from jaxspec.bench.dllm import run_dllm_suite
    from jaxspec.bench.spiffy import markdown_report as spiffy_report
    from jaxspec.bench.spiffy import run_spiffy_suite

    m, p = LLADA
    prompts = [BenchPrompt("t/0", PROMPT)]
    res = run_dllm_suite(
        m,
        p,
        prompts,
        model_name="tiny",
        gen_length=G,
        block_length=L,
        methods=["stepwise", "threshold-0.3"],
        caches=["none"],
        eos_ids=(0,),
        progress=False,
        overhead_reps=0,
        prompt_set="chat",
    )
    cols = [
        c.strip()
        for c in next(line for line in dllm_report(res).splitlines() if line.startswith("| method"))
        .strip("|")
        .split("|")
    ]
    assert cols[:10] == [
        "method",
        "cache",
        "set",
        "prompts",
        "answer len",
        "answer NFE",
        "answer tok/NFE",
        "answer tok/s",
        "answer vs stepwise",
        "answer vs none/stepwise",
    ]
    assert cols.index("flag") < cols.index("NFE") < cols.index("vs stepwise")
    step = next(r for r in res["rows"] if r["method"] == "stepwise")
    assert step["answer_speedup_vs_stepwise"] == 1.0 and step["prompt_set"] == "chat"
    assert res["per_prompt"][0]["runs"]["stepwise/none"]["answer_nfe"] == step["answer_nfe"]

    sp = run_spiffy_suite(
        m,
        p,
        prompts,
        model_name="tiny",
        graphs={4: GRAPH},
        gen_length=G,
        block_length=L,
        rows=[(4, "stepwise")],
        eos_ids=(0,),
        progress=False,
        prompt_set="long",
    )
    cols = [
        c.strip()
        for c in next(
            line for line in spiffy_report(sp).splitlines() if line.startswith("| method")
        )
        .strip("|")
        .split("|")
    ]
    assert cols[:8] == [
        "method",
        "unmasking",
        "D",
        "set",
        "answer len",
        "answer NFE",
        "answer tok/NFE",
        "answer tok/s",
    ]
    assert cols.index("answer total") < cols.index("flag") < cols.index("NFE speedup")
    row = next(r for r in sp["rows"] if r["method"] == "spiffy")
    assert row["answer_total_speedup"] == pytest.approx(row["answer_nfe_speedup"], abs=1e-3)


# ----------------------------------------------------------------------------- prompt sets


def test_long_prompt_set_alternates_humaneval_and_heldout_functions():
    from pathlib import Path

    from jaxspec.eval.datasets import heldout_modules, prompt_set_texts
    from jaxspec.training.data import is_heldout

    texts = prompt_set_texts("long", None, 4, start=1)
    ids = [t for t, _ in texts]
    assert ids[0].startswith("stdlib/") and ids[1] == "HumanEval/1"
    assert ids[2].startswith("stdlib/") and ids[3] == "HumanEval/2"
    hold = heldout_modules()
    for tid, text in texts:
        if tid.startswith("stdlib/"):
            path = tid[len("stdlib/") :].split(":")[0]
            assert is_heldout(Path(path), hold)
            assert "def " + tid.split(":")[1] in text and text.rstrip().endswith(('"""', "'''"))
        else:
            assert "<|im_start|>" not in text and text.lstrip().startswith(
                ("def", "from", "import")
            )
    with pytest.raises(ValueError, match="unknown prompt set"):
        prompt_set_texts("longest", None, 2)
    with pytest.raises(ValueError, match="limit >= 1"):
        prompt_set_texts("long", None, 0)


def test_chat_prompt_set_uses_the_chat_template(monkeypatch):
    import jaxspec.eval.datasets as ds

    class Tok:
        chat_template = "x"

        def apply_chat_template(self, msgs, add_generation_prompt):
            return f"<user>{msgs[0]['content']}</user><assistant>"

    monkeypatch.setattr(
        ds,
        "mtbench_questions",
        lambda: [
            {"question_id": 81 + i, "turns": [f"question {i}", "follow-up"]} for i in range(3)
        ],
    )
    texts = ds.prompt_set_texts("chat", Tok(), 3)
    assert [t for t, _ in texts] == ["HumanEval/0", "mt-bench/81", "HumanEval/1"]
    assert all(x.startswith("<user>") for _, x in texts) and "question 0" in texts[1][1]
