"""Magpie-style self-generated prompts (jaxspec.training.magpie): the pre-query template, the
code stubs, the sampled queries (the model's own sampling, kept in a file a rerun reuses) and
the prompts built from them."""

from __future__ import annotations

import ast
import json

import numpy as np
import pytest

from jaxspec.eval.datasets import chat_prompt
from jaxspec.testing.tiny import CharTok, ChatCharTok, tiny_model
from jaxspec.training.data import DataError
from jaxspec.training.magpie import CODE_LEAD, code_stub, magpie_prompts, pre_query, sample_queries


def test_pre_query_is_the_template_before_the_users_text():
    assert pre_query(ChatCharTok()) == "<user>"
    with pytest.raises(DataError, match="chat template"):
        pre_query(CharTok())

    class Hiding(ChatCharTok):
        def apply_chat_template(self, messages, add_generation_prompt=True):
            return "<user>hidden<assistant>"

    with pytest.raises(DataError, match="verbatim"):
        pre_query(Hiding())


def test_code_stub_is_a_signature_and_the_first_paragraph_as_docstring():
    q = CODE_LEAD + "pairs(xs, k=2)` that returns the pairs of `xs`.\n\nFor example: ..."
    stub = code_stub(q)
    assert stub == (
        "def pairs(xs, k=2):\n"
        '    """Write a Python function `pairs(xs, k=2)` that returns the pairs of `xs`.\n'
        '    """\n'
    )
    fn = ast.parse(stub + "    pass\n").body[0]
    assert fn.name == "pairs" and ast.get_docstring(fn).startswith("Write a Python function")
    long = code_stub(CODE_LEAD + "f(a)` " + "word " * 60)
    assert all(len(line) <= 88 for line in long.splitlines()) and long.endswith('    """\n')
    full = code_stub(CODE_LEAD + "f(a)` " + "x" * 53 + " " + "y" * 30)  # first line past the limit
    assert max(len(line) for line in full.splitlines()) <= 88
    assert code_stub("Write a function that sorts") is None  # no signature named
    assert code_stub(CODE_LEAD + "f(1 +)` does") is None  # not Python
    assert code_stub(CODE_LEAD + 'f(x)` returns """') is None  # would close the docstring


def test_queries_are_the_models_own_samples_and_a_rerun_continues(tmp_path):
    from jaxspec.causal.decode import generate
    from jaxspec.core.sampling import SamplingConfig

    model, params = tiny_model(128, seed=3)
    tok, path = ChatCharTok(), tmp_path / "q.jsonl"
    kw = dict(split="train", chat_fraction=0.5, seed=5, batch=4, max_query_tokens=8)
    first = sample_queries(model, params, tok, path, count=3, progress=False, **kw)
    assert [r["j"] for r in first] == [0, 1, 2] and len(path.read_text().splitlines()) == 4
    assert {r["kind"] for r in first} <= {"chat", "code"}
    # each row is lead + the model's sampled continuation of pre-query + lead, to its EOS
    res = generate(
        model,
        params,
        [
            tok.encode("<user>" + r["lead"])
            for r in first + [json.loads(path.read_text().splitlines()[3])]
        ],
        max_new_tokens=8,
        sampling=SamplingConfig(temperature=1.0, top_p=0.95),
        seed=int(np.random.default_rng([5, 0, 0]).integers(2**31)),
        eos_ids=(4,),
    )
    for r, toks in zip(first, res.tokens):
        toks = [int(t) for t in toks]
        cut = toks[: toks.index(4)] if 4 in toks else toks
        assert r["query"] == r["lead"] + tok.decode(cut) and r["ended"] == (4 in toks)
    more = sample_queries(model, params, tok, path, count=6, progress=False, **kw)
    assert more[:3] == first and [r["j"] for r in more] == list(range(6))
    assert len(path.read_text().splitlines()) == 8  # one more batch of 4
    with path.open("a") as f:  # an interrupted write is ignored
        f.write('{"j": 8, "spl')
    assert sample_queries(model, params, tok, path, count=6, progress=False, **kw) == more
    # ... and cut before the next rows are appended, so later reruns read the file
    grown = sample_queries(model, params, tok, path, count=10, progress=False, **kw)
    assert grown[:6] == more and len(path.read_text().splitlines()) == 12
    assert sample_queries(model, params, tok, path, count=10, progress=False, **kw) == grown
    for other in (dict(seed=6), dict(chat_fraction=0.52), dict(max_query_tokens=9)):
        with pytest.raises(DataError, match="sampled otherwise.*new file"):
            sample_queries(model, params, tok, path, count=6, progress=False, **dict(kw, **other))
    with pytest.raises(DataError, match="split"):
        sample_queries(model, params, tok, path, count=1, split="test", progress=False)


def _rows(queries, ended=None):
    ended = ended or [True] * len(queries)
    return "".join(
        json.dumps(
            {
                "j": j,
                "split": "train",
                "settings": dict(
                    seed=0, chat_fraction=0.0, temperature=1.0, top_p=0.95, max_query_tokens=96
                ),
                "kind": "code",
                "lead": CODE_LEAD,
                "query": q,
                "ended": e,
            }
        )
        + "\n"
        for j, (q, e) in enumerate(zip(queries, ended))
    )


def test_prompts_keep_the_usable_queries_and_reuse_the_file(tmp_path):
    good = CODE_LEAD + "f(x)` that returns x twice."
    other = CODE_LEAD + "g(a, b)` that adds a and b."
    path = tmp_path / "q.jsonl"
    third = CODE_LEAD + "h(s)` that counts s."
    # no signature; a repeat; unfinished (cut by the budget); usable; cut by the budget but
    # its first paragraph complete (all a stub takes)
    path.write_text(
        _rows(
            [good, CODE_LEAD + "that sorts things", good, other + " and", other, third + "\n\nE"],
            [True, True, True, False, True, False],
        )
    )
    # model None: the file holds enough, nothing is sampled
    kw = dict(chat_fraction=0.0, max_tries=6, progress=False)
    got = magpie_prompts(None, None, ChatCharTok(), path, n=3, **kw)
    assert [p["source"] for p in got] == ["magpie:train:0", "magpie:train:4", "magpie:train:5"]
    assert [p["text"] for p in got] == [code_stub(good), code_stub(other), code_stub(third)]
    assert all(p["kind"] == "code" and p["split"] == "train" for p in got)
    with pytest.raises(DataError, match="only 3 usable train queries of 6"):
        magpie_prompts(None, None, ChatCharTok(), path, n=4, **kw)
    # prompts of another split (or any given texts) are left out
    rest = magpie_prompts(None, None, ChatCharTok(), path, n=2, exclude=[code_stub(good)], **kw)
    assert [p["source"] for p in rest] == ["magpie:train:4", "magpie:train:5"]
    assert magpie_prompts(None, None, ChatCharTok(), path, n=0, **kw) == []


def test_chat_prompts_from_a_tiny_model(tmp_path):
    model, params = tiny_model(128, seed=3)
    tok, path = ChatCharTok(), tmp_path / "q.jsonl"
    kw = dict(n=5, chat_fraction=1.0, must_end=False, min_chars=1, batch=4, max_query_tokens=6)
    got = magpie_prompts(model, params, tok, path, progress=False, **kw)
    rows = {r["j"]: r for r in map(json.loads, path.read_text().splitlines())}
    assert len(got) == 5
    for p in got:
        r = rows[int(p["source"].split(":")[-1])]
        assert p["kind"] == "chat" and p["text"] == chat_prompt(r["query"], tok)
    assert magpie_prompts(None, None, tok, path, progress=False, **kw) == got  # from the file
