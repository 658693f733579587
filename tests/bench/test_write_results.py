"""Benchmark results are written atomically (:func:`jaxspec.bench.report.write_results`): each
file goes to a temporary name beside it and is renamed over the target, so a run that fails
while writing leaves the earlier file whole and no temporary file behind."""

from __future__ import annotations

import json

import pytest

from jaxspec.bench.report import write_results

RESULT = {"suite": "t", "rows": [{"model": "m"}]}


def _report(result: dict) -> str:
    return f"# {result['suite']}\n"


def _plot(result: dict, out):
    out.write_bytes(b"png")
    return out


def test_write_results_writes_all_three(tmp_path):
    js, md = write_results(RESULT, tmp_path / "r.json", report=_report, plot=_plot)
    assert json.loads(js.read_text()) == RESULT
    assert md.read_text() == "# t\n\n![per-prompt throughput](r.png)\n"
    assert (tmp_path / "r.png").read_bytes() == b"png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md", "r.png"]


def test_a_failing_write_keeps_the_old_files_whole(tmp_path):
    write_results(RESULT, tmp_path / "r.json", report=_report, plot=_plot)

    def broken_plot(result, out):
        out.write_bytes(b"half a pic")
        raise RuntimeError("plot failed")

    new = {"suite": "new", "rows": [{"model": "m"}]}
    with pytest.raises(RuntimeError, match="plot failed"):
        write_results(new, tmp_path / "r.json", report=_report, plot=broken_plot)
    assert (tmp_path / "r.png").read_bytes() == b"png"  # not the half-written one
    assert (tmp_path / "r.md").read_text().startswith("# t")
    assert json.loads((tmp_path / "r.json").read_text()) == new  # written before the plot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md", "r.png"]
