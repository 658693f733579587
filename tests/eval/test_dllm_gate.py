"""The v2 masked-diffusion gate (issue 15): figures before the first EOS, the pass rule,
held-out function prompts, and the shared HumanEval program builder."""

from __future__ import annotations

import pytest

from jaxspec.eval.dllm_gate import (
    eos_completion_figures,
    heldout_function_prompts,
    stepwise_completions,
    v2_gate_checks,
)
from jaxspec.eval.metrics import answer_degeneracy
from jaxspec.eval.quality import completion_program
from jaxspec.testing.tiny import CharTok, tiny_diffusion_model

EOS = 0


def test_figures_are_computed_before_the_first_eos():
    answer = [5, 6, 7, 8, 9, 10]
    looping = [3, 4] * 4  # never ends
    figs = eos_completion_figures([answer + [EOS] * 2, looping], [EOS], budget=8)
    a, b = figs["per_completion"]
    assert a == {
        "answer_tokens": 6,
        "ends_with_eos": True,
        "eos_share": 0.25,
        "distinct_token_share": 1.0,
        "repeated_ngram_rate": 0.0,
        "longest_run": 1,
    }
    assert b["answer_tokens"] == 8 and not b["ends_with_eos"] and b["eos_share"] == 0.0
    assert b["distinct_token_share"] == pytest.approx(2 / 8)
    assert b["repeated_ngram_rate"] == pytest.approx(3 / 5)  # 5 4-grams, 3 seen before
    assert figs["mean"]["ends_with_eos"] == 0.5
    checks = v2_gate_checks(figs["mean"])
    # means: repeated 4-gram rate (0 + 0.6) / 2 = 0.3 (at the bound, passes), distinct share
    # (1 + 0.25) / 2 = 0.625, ends with EOS 0.5 < 0.8 (fails)
    assert [c["passed"] for c in checks] == [True, True, False]
    good = eos_completion_figures([answer + [EOS] * 2] * 5, [EOS], budget=8)["mean"]
    assert all(c["passed"] for c in v2_gate_checks(good))


def test_benchmark_row_figures_split_the_answer_from_the_eos_tail():
    """The diffusion suites' degeneracy columns read only the answer; the EOS tail is its own
    column (issue 15). A looping answer must not be hidden by a long clean EOS tail."""
    loop_then_eos = [3, 4, 3, 4, 3, 4, EOS, EOS]
    row = answer_degeneracy([[5, 6, 7, 8, 9, 10, EOS, EOS], loop_then_eos], [EOS], budget=8)
    assert row["answer_tokens"] == 6 and row["eos_share"] == 0.25
    assert row["repeated_ngram_rate"] == pytest.approx((0 + 1 / 3) / 2, abs=1e-4)
    assert row["distinct_token_share"] == pytest.approx((1 + 2 / 6) / 2, abs=1e-4)
    assert row["longest_run"] == 1  # the EOS run of the tail is not counted


def test_heldout_prompts_are_signatures_and_docstrings():
    prompts = heldout_function_prompts(CharTok(), ["json"], 3, seq_len=2000, eos_id=EOS)
    assert len(prompts) == 3
    for p in prompts:
        text = CharTok().decode(p)
        assert "def " in text and '"""' in text and text.rstrip().endswith('"""')


def test_stepwise_completions_keep_eos_tails():
    model, params = tiny_diffusion_model("llada")
    out = stepwise_completions(
        model,
        params,
        [[5, 6, 7], [3, 1, 4, 1]],
        gen_length=16,
        block_length=8,
        cache="dual",
        eos_ids=(2,),
        pad_id=0,
        batch=1,
    )
    assert [len(c) for c in out] == [16, 16]
    both = stepwise_completions(
        model,
        params,
        [[5, 6, 7], [3, 1, 4, 1]],
        gen_length=16,
        block_length=8,
        cache="dual",
        eos_ids=(2,),
        pad_id=0,
        batch=2,
    )
    assert both == out  # batching does not change a greedy completion


def test_completion_program_cuts_at_top_level():
    p = {
        "prompt": "def f(x):\n",
        "test": "def check(g):\n    assert g(2) == 4\n",
        "entry_point": "f",
    }
    prog = completion_program(p, "    return x * 2\ndef junk():\n    pass\n")
    assert "junk" not in prog and prog.startswith("def f(x):\n    return x * 2\n")
    ns: dict = {}
    exec(prog, ns)  # the tests pass: check(f) raised nothing


def test_v3_rule_adds_masked_accuracy_and_answer_length_bounds():
    """The v3 rule is stricter than v2 on the same figures, and its extra checks fail when
    their figures are missing or short (never pass by default)."""
    from jaxspec.eval.dllm_gate import V3_GATE_RULE, gate_checks

    answer = [5, 6, 7, 8, 9, 10]
    mean = eos_completion_figures([answer + [EOS] * 2] * 5, [EOS], budget=8)["mean"]
    good_masked = {"0.15": 0.70, "0.50": 0.50}
    checks = gate_checks(
        mean, V3_GATE_RULE, masked_accuracy=good_masked, median_answer=6, ar_median_answer=10
    )
    assert len(checks) == 6 and all(c["passed"] for c in checks)
    short = gate_checks(
        mean, V3_GATE_RULE, masked_accuracy=good_masked, median_answer=4, ar_median_answer=10
    )
    assert [c["passed"] for c in short] == [True] * 5 + [False]  # 0.4 < half of AR's
    low = gate_checks(
        mean,
        V3_GATE_RULE,
        masked_accuracy={"0.15": 0.64, "0.50": 0.5},
        median_answer=6,
        ar_median_answer=10,
    )
    assert [c["passed"] for c in low] == [True, True, True, False, True, True]
    missing = gate_checks(mean, V3_GATE_RULE)
    assert [c["passed"] for c in missing] == [True, True, True, False, False, False]
    # a 4-gram rate of 0.25 passes v2 (<= 0.3) but fails v3 (<= 0.2)
    loopy = {**mean, "repeated_ngram_rate": 0.25}
    assert v2_gate_checks(loopy)[0]["passed"]
    assert not gate_checks(loopy, V3_GATE_RULE)[0]["passed"]


def test_ar_completions_are_cut_after_eos_and_batching_keeps_them():
    from jaxspec.eval.dllm_gate import ar_completions
    from jaxspec.testing.tiny import tiny_model

    model, params = tiny_model()
    prompts = [[5, 6, 7], [3, 1, 4, 1, 5]]
    one = ar_completions(model, params, prompts, max_new_tokens=12, eos_ids=(2,), pad_id=0, batch=1)
    two = ar_completions(model, params, prompts, max_new_tokens=12, eos_ids=(2,), pad_id=0, batch=2)
    assert one == two
    for c in one:
        assert 1 <= len(c) <= 12 and 2 not in c[:-1]
