"""Seed spread of sequential vs ASSD / ASSD-ngram judged PPL on the 16 sequences and masks of
results/assd.json, as recorded in results/assd-seeds/ (see its README.md for the commit whose
results/assd.json and model this reproduces).

    .venv/bin/python benchmarks/probes/assd-seeds/check.py     # from the repository root

Writes /tmp/seedcheck.json.
"""

import json
import sys

import numpy as np
from scipy import stats

from jaxspec.asarm.assd import assd_generate
from jaxspec.core.sampling import SamplingConfig
from jaxspec.eval.judge import smollm2_judge
from jaxspec.eval.quality import heldout_snippets, random_mask
from jaxspec.training.config import load_config
from models.registry import load_asarm

a = load_asarm("asarm-small")
hold = tuple(load_config("configs/train/asarm-small.yaml").data.holdout)
snips = heldout_snippets(a.tokenizer, hold, 16, prompt_len=255, cont_len=1)
seqs = [a.to_model(s.tokens) for s in snips]
d = json.load(open("results/assd.json"))
masks = [
    np.array(p["masked"], bool)
    if isinstance(p["masked"], list) and len(p["masked"]) == len(s)
    else None
    for p, s in zip(d["per_sequence"], seqs)
]
print("masks from json:", sum(m is not None for m in masks), file=sys.stderr)
if any(m is None for m in masks):
    masks = [random_mask(len(s), 0.95, b) for b, s in enumerate(seqs)]
judge = smollm2_judge(lambda m: None)
out = {}
for method, seed in [("sequential", 1), ("sequential", 2), ("assd-ngram", 1), ("assd", 1)]:
    r = assd_generate(
        a.model, a.params, seqs, masks, method=method, k=5, sampling=SamplingConfig(1.0), seed=seed
    )
    ppl = list(judge([a.to_external(x) for x in r.sequences]))
    out[f"{method}/seed{seed}"] = ppl
    print(
        method,
        seed,
        "median",
        round(float(np.median(ppl)), 1),
        "geo",
        round(float(np.exp(np.mean(np.log(ppl)))), 1),
        flush=True,
    )
ref = {k: v for k, v in out.items() if k.startswith("sequential")}
bench = {
    p: [q["runs"][p]["gen_ppl"] for q in d["per_sequence"]]
    for p in ("sequential/None", "assd/5", "assd-ngram/5")
}
allv = {**{"bench " + k: v for k, v in bench.items()}, **out}
for k, v in allv.items():
    print(
        k,
        "median",
        round(float(np.median(v)), 1),
        "geo",
        round(float(np.exp(np.mean(np.log(v)))), 1),
    )
seq_all = np.log(bench["sequential/None"] + out["sequential/seed1"] + out["sequential/seed2"])
for k in ("assd-ngram/seed1", "assd/seed1"):
    ng = np.log(bench[k.split("/")[0] + "/5"] + out[k])
    print(
        k,
        "pooled log-PPL welch p vs pooled sequential",
        round(stats.ttest_ind(ng, seq_all, equal_var=False).pvalue, 3),
    )
json.dump(allv, open("/tmp/seedcheck.json", "w"))
