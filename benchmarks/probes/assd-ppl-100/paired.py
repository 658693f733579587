"""Paired comparison of the two 100-sequence ASSD runs in ``results/assd-ppl-100/``.

Run 0 (``assd.json``): sequential, assd, assd-ngram, assd-fused, assd-fused-ngram, row seeds
``0 * 1000 + i``. Run 1 (``seed1/assd.json``): sequential and assd-fused, row seeds
``1000 + i``. Both on the same 100 held-out sequences, so each comparison pairs the two
methods' figures sequence by sequence (log gen-PPL and entropy), paired t and Wilcoxon.
Same-decoder pairs (sequential run 1 vs run 0, fused run 1 vs run 0) show how far two runs of
one decoder drift apart. Writes ``results/assd-ppl-100/paired.md``.

    python benchmarks/probes/assd-ppl-100/paired.py

These two runs share one seed per row across all sequences (the suite's rule before
2026-11-25), so their per-sequence values are not independent and the p-values below are not
calibrated: see ``results/assd-seeds-fixed/`` for the runs with one seed per (row, sequence),
compared by the same script:

    python benchmarks/probes/assd-ppl-100/paired.py results/assd-seeds-fixed/run0/assd.json \
        results/assd-seeds-fixed/run1/assd.json results/assd-seeds-fixed/paired.md "TITLE"
"""

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parents[3] / "results" / "assd-ppl-100"  # the data
ARGS = sys.argv[1:]
PATH0, PATH1 = (
    (Path(a) for a in ARGS[:2]) if ARGS else (HERE / "assd.json", HERE / "seed1" / "assd.json")
)
OUT = Path(ARGS[2]) if len(ARGS) > 2 else HERE / "paired.md"
RUN0 = json.loads(PATH0.read_text())["per_sequence"]
RUN1 = json.loads(PATH1.read_text())["per_sequence"]
assert [s["id"] for s in RUN0] == [s["id"] for s in RUN1]
SEQ, FUSED = "sequential/None", "assd-fused/5"


def fig(run, method, field):
    x = np.array([s["runs"][method][field] for s in run])
    return np.log(x) if field == "gen_ppl" else x


def both(method, field):
    return (fig(RUN0, method, field) + fig(RUN1, method, field)) / 2


PAIRS = [
    (
        "sequential run 1 - sequential run 0 (same decoder)",
        lambda f: fig(RUN1, SEQ, f) - fig(RUN0, SEQ, f),
    ),
    (
        "fused run 1 - fused run 0 (same decoder)",
        lambda f: fig(RUN1, FUSED, f) - fig(RUN0, FUSED, f),
    ),
    ("fused run 0 - sequential run 0", lambda f: fig(RUN0, FUSED, f) - fig(RUN0, SEQ, f)),
    ("fused run 1 - sequential run 1", lambda f: fig(RUN1, FUSED, f) - fig(RUN1, SEQ, f)),
    ("fused run 0 - sequential run 1", lambda f: fig(RUN0, FUSED, f) - fig(RUN1, SEQ, f)),
    ("fused run 1 - sequential run 0", lambda f: fig(RUN1, FUSED, f) - fig(RUN0, SEQ, f)),
    (
        "fused (mean of 2 runs) - sequential (mean of 2 runs)",
        lambda f: both(FUSED, f) - both(SEQ, f),
    ),
]
for m in [m for m in ("assd/5", "assd-ngram/5", "assd-fused-ngram/5") if m in RUN0[0]["runs"]]:
    PAIRS.append(
        (
            f"{m.split('/')[0]} run 0 - sequential (mean of 2 runs)",
            lambda f, m=m: fig(RUN0, m, f) - both(SEQ, f),
        )
    )

TITLE = ARGS[3] if len(ARGS) > 3 else "two 100-sequence ASSD runs (one seed per row)"
lines = [
    f"# Paired comparison of the {TITLE}",
    "",
    f"asarm-small, {len(RUN0)} held-out stdlib sequences, 95% masked, T 1.0, content cache, "
    "UNK suppressed; gen-PPL judged by SmolLM2-135M. Differences per sequence (log gen-PPL, "
    "entropy in nats), paired t-test and Wilcoxon signed-rank p-values; `sign` is the share "
    "of negative differences.",
    "",
    "| comparison | mean diff log PPL | t p | Wilcoxon p | mean diff entropy | t p "
    "| Wilcoxon p | entropy sign |",
    "|---|---|---|---|---|---|---|---|",
]
for name, diff in PAIRS:
    row = [name]
    for f in ("gen_ppl", "entropy"):
        d = diff(f)
        row += [
            f"{d.mean():+.3f}",
            f"{stats.ttest_1samp(d, 0).pvalue:.3f}",
            f"{stats.wilcoxon(d).pvalue:.3f}",
        ]
    row.append(f"{np.mean(diff('entropy') < 0):.2f}")
    lines.append("| " + " | ".join(row) + " |")
OUT.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
