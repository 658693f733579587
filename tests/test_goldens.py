"""Golden outputs of every decoder: the proof that a refactor changed no output.

Each case runs one method / option family on a tiny random model (or a real model, marked
``real``) with a fixed seed and records the tokens and the whole stats record (target NFE,
draft NFE, steps, accepted-tokens histogram, drafts proposed, method-specific extras).
The recorded values live in ``tests/goldens/*.json``; this test recomputes each case and
requires an exact match (float32 on CPU).

Record (only when a change is *meant* to change outputs, and say so in the commit):
``python -m tests.test_goldens --record [--real]``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from jaxspec.testing.cover import pairwise_cover

GOLDEN_DIR = Path(__file__).resolve().parent / "goldens"

# ----------------------------------------------------------------------------- adapters
# The only place that knows where each decoder lives; everything below is data.


def _stats_record(stats) -> dict:
    rec = {
        "method": stats.method,
        "reference": stats.reference,
        "target_nfe": np.asarray(stats.target_nfe).tolist(),
        "draft_nfe": np.asarray(stats.draft_nfe).tolist(),
        "steps": np.asarray(stats.steps).tolist(),
        "accept_hist": np.asarray(stats.accept_hist).tolist(),
        "new_tokens": np.asarray(stats.new_tokens).tolist(),
        "draft_length": int(stats.draft_length),
        "drafts_proposed": (
            None if stats.drafts_proposed is None else np.asarray(stats.drafts_proposed).tolist()
        ),
        "extra": {
            k: (v.tolist() if isinstance(v, np.ndarray) else v)
            for k, v in sorted(stats.extra.items())
        },
    }
    accepted = getattr(stats, "accepted", None)
    if accepted is not None:
        rec["accepted"] = np.asarray(accepted).tolist()
    return rec


def _sampling(kw: dict):
    from jaxspec.core.sampling import SamplingConfig

    return SamplingConfig(**{k: kw[k] for k in ("temperature", "top_k", "top_p") if k in kw})


def run_causal(model, params, prompts, kw: dict) -> dict:
    from jaxspec.causal.decode import generate
    from jaxspec.core.drafters import NgramDrafter

    V = model.config.vocab_size
    drafter = None
    if kw.get("draft_length"):
        drafter = NgramDrafter(
            draft_length=kw["draft_length"],
            vocab_size=V,
            bigram_fallback=kw.get("bigram_fallback", True),
        )
    r = generate(
        model,
        params,
        prompts,
        max_new_tokens=kw["max_new_tokens"],
        sampling=_sampling(kw),
        drafter=drafter,
        seed=kw.get("seed", 0),
        eos_ids=kw.get("eos_ids", ()),
    )
    return {"tokens": r.tokens, "stats": _stats_record(r.stats)}


def _diffusion_record(r) -> dict:
    return {
        "tokens": r.tokens,
        "full_tokens": np.asarray(r.full_tokens).tolist(),
        "transfer_step": np.asarray(r.transfer_step).tolist(),
        "stats": _stats_record(r.stats),
    }


def _decode_config(kw: dict):
    from jaxspec.dllm.decode import DiffusionDecodeConfig

    return DiffusionDecodeConfig(**kw)


def run_dllm(model, params, prompts, kw: dict, seed: int, eos_ids=()) -> dict:
    from jaxspec.dllm.decode import diffusion_generate

    return _diffusion_record(
        diffusion_generate(model, params, prompts, _decode_config(kw), seed=seed, eos_ids=eos_ids)
    )


def run_ssd(model, params, prompts, kw: dict, n: int, tree: str, seed: int, eos_ids=()) -> dict:
    from jaxspec.dllm.ssd import SSDConfig, ssd_generate

    return _diffusion_record(
        ssd_generate(
            model,
            params,
            prompts,
            SSDConfig(_decode_config(kw), n, tree),
            seed=seed,
            eos_ids=eos_ids,
        )
    )


def run_spiffy(model, params, prompts, kw: dict, graph, seed: int, eos_ids=()) -> dict:
    from jaxspec.dllm.spiffy import SpiffyConfig, spiffy_generate

    return _diffusion_record(
        spiffy_generate(
            model,
            params,
            prompts,
            SpiffyConfig(_decode_config(kw), graph),
            seed=seed,
            eos_ids=eos_ids,
        )
    )


def run_assd(model, params, tokens, masked, kw: dict) -> dict:
    from jaxspec.asarm.assd import assd_generate

    r = assd_generate(
        model,
        params,
        tokens,
        masked,
        method=kw["method"],
        k=kw.get("k", 5),
        sampling=_sampling(kw),
        seed=kw.get("seed", 0),
    )
    return {
        "sequences": [np.asarray(s).tolist() for s in r.sequences],
        "stats": _stats_record(r.stats),
    }


def _tiny_graph():
    from jaxspec.dllm.spiffy import DraftGraph

    return DraftGraph(
        (
            ((1, 1),),
            ((1, 2),),
            ((1, 1), (2, 1)),
            ((1, 1), (2, 2)),
            ((1, 2), (2, 1)),
            ((1, 1), (2, 1), (3, 1)),
            ((1, 1), (2, 1), (3, 1), (4, 1)),
        )
    )


def _committed_graph(D: int):
    from jaxspec.dllm.spiffy import load_graph

    root = Path(__file__).resolve().parent.parent
    return load_graph(root / "configs" / "graphs" / "dream-smollm2-135m-v1" / f"D{D}.json")


def family_inputs(family: str, *, max_new_tokens: int = 20, xlnet_heads: int = 2):
    """``(model, params, inputs, options)`` of one family's tiny setting (also used by
    ``tests/models/sharding_worker.py``): ``options`` is ``{option: value}`` for every method
    of the family (each takes the ones it knows: ``Method.configure(options, strict=False)``)."""
    from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model, tiny_xlnet

    if family == "causal":
        from jaxspec.causal.dflash import DFlashSpec, init_drafter

        model, params = tiny_model(64, seed=0, mask_token_id=63)  # a [MASK] for space
        # draft models for the methods that take one (sps: causal; diffuspec, specdiff: a
        # diffusion LM; dflash: a random block drafter of block 5 = draft length 4 + 1); the
        # others ignore them
        spec = DFlashSpec.for_target(model.config, block_size=5)
        return (
            model,
            params,
            [[3, 9, 4, 9, 4, 9, 4, 17, 2], [5, 6, 7, 5, 6, 7, 5]],
            dict(
                max_new_tokens=max_new_tokens,
                draft_length=4,
                draft_model=tiny_model(64, seed=1),
                drafter_model=(spec, init_drafter(spec, seed=2)),
                dllm_drafter=tiny_diffusion_model("dream", vocab=64, ctx=512),
                k_min=2,
                eos_id=7,
            ),
        )
    if family == "dllm":
        model, params = tiny_diffusion_model("llada")
        return (
            model,
            params,
            [[5, 6, 7, 8, 9, 10, 11], [3, 1, 4]],
            dict(gen_length=16, block_length=8, draft_length=3),
        )
    model, params = tiny_xlnet(11, 1, n_head=xlnet_heads)
    rng = np.random.default_rng(3)
    tasks = []
    for n in (9, 13):
        m = rng.random(n) < 0.7
        m[1] = True
        tasks.append((rng.integers(0, 11, n).tolist(), m.tolist()))
    return model, params, tasks, dict(draft_length=3)


def run_registered(name: str, temperature: float, seed: int = 3) -> dict:
    """One registered method through the registry on its family's tiny setting
    (:func:`family_inputs`): the guard for the methods the per-family cases above miss."""
    from jaxspec.methods import get_method, run

    method = get_method(name)
    model, params, inputs, opts = family_inputs(method.family)
    opts = dict(
        opts,
        temperature=temperature,
        top_k=20 if temperature else 0,
        top_p=0.9 if temperature else 1.0,
    )
    r = run(method, model, params, inputs, method.configure(opts, strict=False), seed=seed)
    return {"tokens": r.tokens, "stats": _stats_record(r.stats)}


# ----------------------------------------------------------------------------- tiny cases


def _tiny_causal():
    from jaxspec.testing.tiny import tiny_model

    return tiny_model(64, seed=0)


def _tiny_dllm(head):
    from jaxspec.testing.tiny import tiny_diffusion_model

    return tiny_diffusion_model(head)


def _tiny_xlnet():
    from jaxspec.testing.tiny import tiny_xlnet

    return tiny_xlnet(11, seed=1)


CAUSAL_PROMPTS = [[3, 9, 4, 9, 4, 9, 4, 17, 2], [5, 6, 7, 5, 6, 7, 5]]
DLLM_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 1, 4]]


def tiny_cases(factors: dict | None = None) -> dict:
    """name -> zero-argument function returning the case's record. ``factors``, if given,
    receives name -> {option: value} for the cases of the dllm / ssd / spiffy cross-products
    (see :func:`covered_cases`)."""
    cases = {}
    factors = {} if factors is None else factors
    samp = dict(temperature=0.8, top_k=20, top_p=0.9)
    for name, kw in {
        "ar-greedy": dict(max_new_tokens=24),
        "ar-sampled": dict(max_new_tokens=24, seed=1, **samp),
        "ar-eos": dict(max_new_tokens=24, eos_ids=(7, 11)),
        "ngram-greedy": dict(max_new_tokens=24, draft_length=4),
        "ngram-sampled": dict(max_new_tokens=24, draft_length=3, seed=2, **samp),
        "ngram-nofallback": dict(max_new_tokens=24, draft_length=5, bigram_fallback=False),
        "ngram-nofallback-sampled": dict(
            max_new_tokens=20, draft_length=2, bigram_fallback=False, seed=4, temperature=1.0
        ),
    }.items():
        cases[f"causal/{name}"] = lambda kw=kw: run_causal(*_tiny_causal(), CAUSAL_PROMPTS, kw)

    rules = {"stepwise": {}, "fixed2": dict(tokens_per_step=2), "threshold": dict(threshold=0.3)}
    for head in ("llada", "dream"):
        for rule, rkw in rules.items():
            for cache in ("none", "prefix", "dual"):
                for mode, mkw in (("greedy", {}), ("sampled", dict(temperature=0.8))):
                    if head == "dream" and mode == "sampled" and cache == "prefix":
                        continue
                    kw = dict(gen_length=16, block_length=8, steps=16, cache=cache, **rkw, **mkw)
                    name = f"dllm/{head}-{rule}-{cache}-{mode}"
                    cases[name] = lambda head=head, kw=kw: run_dllm(
                        *_tiny_dllm(head), DLLM_PROMPTS, kw, 3
                    )
                    factors[name] = dict(head=head, rule=rule, cache=cache, mode=mode)
    for name, kw in {
        "entropy-dream": dict(remasking="entropy", schedule="dream"),
        "topk_margin": dict(remasking="topk_margin"),
        "random": dict(remasking="random"),
        "origin": dict(remasking="origin"),
        "maskgit-algtemp": dict(remasking="maskgit_plus", temperature=0.5, alg_temp=0.3),
        "topk-topp": dict(temperature=0.7, top_k=5, top_p=0.9),
        "eos-options": dict(logits_eos_inf=True, confidence_eos_eot_inf=True),
        "cfg": dict(cfg_scale=1.5),
    }.items():
        kw = dict(gen_length=16, block_length=8, steps=16, **kw)
        eos = (12, 30) if "eos" in name else ()
        cases[f"dllm/rule-{name}"] = lambda kw=kw, eos=eos: run_dllm(
            *_tiny_dllm("dream"), DLLM_PROMPTS, kw, 5, eos
        )

    for head in ("llada", "dream"):
        for tree in ("chain", "mix-order"):
            for cache in ("none", "dual"):
                for mode, mkw in (("greedy", {}), ("sampled", dict(temperature=0.8))):
                    kw = dict(gen_length=16, block_length=8, steps=16, cache=cache, **mkw)
                    name = f"ssd/{head}-{tree}-{cache}-{mode}"
                    cases[name] = lambda head=head, kw=kw, tree=tree: run_ssd(
                        *_tiny_dllm(head), DLLM_PROMPTS, kw, 3, tree, 3
                    )
                    factors[name] = dict(head=head, tree=tree, cache=cache, mode=mode)
    for head in ("llada", "dream"):
        for rule, rkw in rules.items():
            for cache in ("none", "dual"):
                for mode, mkw in (("greedy", {}), ("sampled", dict(temperature=0.8))):
                    kw = dict(gen_length=16, block_length=8, steps=16, cache=cache, **rkw, **mkw)
                    name = f"spiffy/{head}-{rule}-{cache}-{mode}"
                    cases[name] = lambda head=head, kw=kw: run_spiffy(
                        *_tiny_dllm(head), DLLM_PROMPTS, kw, _tiny_graph(), 3
                    )
                    factors[name] = dict(head=head, rule=rule, cache=cache, mode=mode)

    rng = np.random.default_rng(7)
    toks, masks = [], []
    for n in (9, 14, 6):
        m = rng.random(n) < 0.7
        m[0] = False
        m[1] = True
        toks.append(rng.integers(0, 11, n).tolist())
        masks.append(m.tolist())
    for method in ("sequential", "assd", "assd-ngram", "assd-fused", "assd-fused-ngram"):
        for mode, mkw in (
            ("greedy", {}),
            ("sampled", dict(temperature=1.0, seed=5)),
            ("topk-topp", dict(temperature=0.7, top_k=6, top_p=0.9, seed=6)),
        ):
            kw = dict(method=method, k=3, **mkw)
            cases[f"assd/{method}-{mode}"] = lambda kw=kw: run_assd(*_tiny_xlnet(), toks, masks, kw)
    # the causal methods with a draft model (no per-family case above), through the registry
    for method in ("sps", "space", "diffuspec", "specdiff"):
        for mode, temp in (("greedy", 0.0), ("sampled", 0.9)):
            cases[f"registry/{method}-{mode}"] = lambda method=method, temp=temp: run_registered(
                method, temp
            )
    return cases


# ----------------------------------------------------------------------------- real cases

_REAL_MODELS: dict = {}


def _real(name: str):
    if name not in _REAL_MODELS:
        from models.registry import load_model

        _REAL_MODELS[name] = load_model(name, log=lambda m: None)
    return _REAL_MODELS[name]


def real_cases() -> dict:
    cases = {}
    texts = ["def fibonacci(n):\n", "import os\n\ndef list_files(path):\n"]

    def causal(kw):
        model, params, tok, _ = _real("smollm2-135m-instruct")
        return run_causal(
            model,
            params,
            [tok.encode(t) for t in texts],
            dict(eos_ids=tuple(tok.eos_token_ids), **kw),
        )

    # the CPU's default decode layout (the test suite runs scan; tests/conftest.py)
    def unrolled(kw):
        with mock.patch.dict(os.environ, {"JAXSPEC_LAYER_LOOP": "unrolled"}):
            return causal(kw)

    cases["smollm2/ar-greedy"] = lambda: unrolled(dict(max_new_tokens=32))
    cases["smollm2/ngram-greedy"] = lambda: causal(dict(max_new_tokens=32, draft_length=6))
    cases["smollm2/ngram-sampled"] = lambda: causal(
        dict(max_new_tokens=24, draft_length=4, temperature=0.7, top_p=0.95, seed=3)
    )

    def dream(fn, **kw):
        # pinned to v1: the goldens guard the decoders, not the default preset's weights
        model, params, tok, _ = _real("dream-smollm2-135m-v1")
        return fn(model, params, [tok.encode(t) for t in texts], **kw)

    base = dict(gen_length=32, block_length=8, steps=32)
    cases["dream/stepwise-none"] = lambda: dream(run_dllm, kw=dict(base), seed=0)
    cases["dream/threshold-dual"] = lambda: dream(
        run_dllm, kw=dict(base, threshold=0.9, cache="dual"), seed=0
    )
    cases["dream/fixed2-prefix-sampled"] = lambda: dream(
        run_dllm, kw=dict(base, tokens_per_step=2, cache="prefix", temperature=0.7), seed=1
    )
    cases["dream/ssd-chain-dual"] = lambda: dream(
        run_ssd, kw=dict(base, cache="dual"), n=4, tree="chain", seed=0
    )
    g32 = dict(gen_length=32, block_length=32, steps=32)
    cases["dream/spiffy-D5-stepwise-dual"] = lambda: dream(
        run_spiffy, kw=dict(g32, cache="dual"), graph=_committed_graph(5), seed=0
    )

    def asarm(kw):
        model, params, m, _ = _real("asarm-small")
        text = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
        ids = m.to_model(m.tokenizer.encode(text))
        masked = [False] * len(ids)
        for i in range(4, len(ids) - 3):
            if i % 3:
                masked[i] = True
        return run_assd(model, params, [ids], [masked], kw)

    for method in ("sequential", "assd", "assd-ngram", "assd-fused"):
        cases[f"asarm/{method}-sampled"] = lambda method=method: asarm(
            dict(method=method, k=5, temperature=1.0, seed=1)
        )
    cases["asarm/assd-greedy"] = lambda: asarm(dict(method="assd", k=5))
    return cases


# ----------------------------------------------------------------------------- the test


def _load(kind: str) -> dict:
    path = GOLDEN_DIR / f"{kind}.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: record it with python -m tests.test_goldens --record")
    return json.loads(path.read_text())


def _jsonable(x):
    return json.loads(json.dumps(x))


_FACTORS: dict = {}
_TINY = tiny_cases(_FACTORS)


def covered_cases() -> set:
    """The tiny cases ``make test`` runs: every case outside the dllm / ssd / spiffy
    cross-products, and from each product a pairwise-covering subset (every pair of option
    values, e.g. ``cache=dual`` with ``mode=sampled``, still runs once; 33 -> 9, 16 -> 6 and
    24 -> 7 cases). ``make test-all`` runs the whole product (the others are marked slow)."""
    keep = set(_TINY) - set(_FACTORS)
    for family in {n.split("/")[0] for n in _FACTORS}:
        keep |= set(
            pairwise_cover({n: f for n, f in _FACTORS.items() if n.startswith(family + "/")})
        )
    return keep


_COVERED = covered_cases()


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in _COVERED else pytest.mark.slow) for n in sorted(_TINY)],
)
def test_tiny_golden(name):
    want = _load("tiny")[name]
    got = _jsonable(_TINY[name]())
    assert got == want, f"{name}: output differs from the recorded golden"


def test_covered_subset_keeps_every_option_pair():
    """The subset ``make test`` runs still pairs every option value with every other one
    (the property :func:`covered_cases` promises), and it is a real subset."""
    from itertools import combinations

    for family in ("dllm", "ssd", "spiffy"):
        full = {n: f for n, f in _FACTORS.items() if n.startswith(family + "/")}
        kept = {n: f for n, f in full.items() if n in _COVERED}
        assert 0 < len(kept) < len(full)
        pairs = lambda fs: {p for f in fs for p in combinations(sorted(f.items()), 2)}
        assert pairs(kept.values()) == pairs(full.values()), family


# the real Spiffy golden (90 s, mostly compiling the draft-graph loop) and the two sampled real
# goldens of n-gram and fixed-2 / prefix (about 120 s) run in make test-all; make test keeps the
# tiny goldens (sampled ones included) and the greedy real goldens of the same models
_SLOW_REAL = (
    "dream/spiffy-D5-stepwise-dual",
    "smollm2/ngram-sampled",
    "dream/fixed2-prefix-sampled",
)


@pytest.mark.real
@pytest.mark.parametrize(
    "name",
    [
        n if n not in _SLOW_REAL else pytest.param(n, marks=pytest.mark.slow)
        for n in sorted(real_cases())
    ],
)
def test_real_golden(name, smollm2_gguf):
    want = _load("real")[name]
    got = _jsonable(real_cases()[name]())
    assert got == want, f"{name}: output differs from the recorded golden"


def test_real_ngram_golden_is_the_ar_golden():
    """The recorded real n-gram goldens (greedy, bigram fallback) hold AR's greedy tokens, so
    the golden tests above also check losslessness on the real weights; a re-recording with a
    lossy drafter would fail here."""
    real = _load("real")
    assert real["smollm2/ngram-greedy"]["tokens"] == real["smollm2/ar-greedy"]["tokens"]
    assert all(len(t) == 32 for t in real["smollm2/ar-greedy"]["tokens"])


def record(kinds, only: tuple = ()) -> None:
    """Record the goldens of ``kinds``; with ``only`` (name prefixes) re-record just the cases
    whose name starts with one of them and keep every other recorded value as it is."""
    GOLDEN_DIR.mkdir(exist_ok=True)
    for kind in kinds:
        cases = tiny_cases() if kind == "tiny" else real_cases()
        path = GOLDEN_DIR / f"{kind}.json"
        out = json.loads(path.read_text()) if only and path.is_file() else {}
        out = {n: v for n, v in out.items() if n in cases}
        for i, (name, fn) in enumerate(sorted(cases.items())):
            if only and not name.startswith(tuple(only)):
                continue
            print(f"[{i + 1}/{len(cases)}] {name}", file=sys.stderr, flush=True)
            out[name] = _jsonable(fn())
        (GOLDEN_DIR / f"{kind}.json").write_text(
            json.dumps(out, indent=None, sort_keys=True).replace('}, "', '},\n "') + "\n"
        )


if __name__ == "__main__":
    if "--record" not in sys.argv:
        sys.exit(
            "usage: python -m tests.test_goldens --record [--real] [--real-only] "
            "[--only PREFIX ...]"
        )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    only = tuple(sys.argv[sys.argv.index("--only") + 1 :]) if "--only" in sys.argv else ()
    record(
        (["tiny"] if "--real-only" not in sys.argv else [])
        + (["real"] if "--real" in sys.argv or "--real-only" in sys.argv else []),
        only,
    )
