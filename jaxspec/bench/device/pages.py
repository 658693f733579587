"""The result pages of the device run: each suite's json, markdown page and figure, the
bundle returned under ``$OUT``, and their collection on the CPU machine.

Each suite's page opens with the machine it ran on (:func:`machine_header`), counts how many
planned rows ran and why the rest did not (:func:`coverage`), and
tables the rows (:func:`markdown_suite`). :func:`collect` unpacks a returned bundle into a
results folder (e.g. ``results/gpu``) and reads the run log for how each suite ended
(:func:`parse_run_log`).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Optional, Sequence

from jaxspec.bench.device.pack import PackError

# The suites of the device run (each writes ``<suite>.json/.md/.png``).
SUITES = ("methods-causal", "methods-dllm", "methods-asarm", "peers", "projection")


# ----------------------------------------------------------------------------- results


def write_suite(result: dict, out_dir: Path, *, plot: bool = True) -> list[Path]:
    """Write one suite's ``<suite>.json`` and ``.md`` (and ``.png`` with ``plot``) under
    ``out_dir``. The markdown header names the accelerator, driver, JAX and torch."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / result["suite"]
    paths = [base.with_suffix(".json")]
    paths[0].write_text(json.dumps(result, indent=2, default=str) + "\n")
    png = None
    if plot and result.get("rows"):
        try:
            png = plot_suite(result, base.with_suffix(".png"))
            paths.append(png)
        except Exception as e:  # noqa: BLE001 - a failed chart must not lose the numbers
            result.setdefault("notes", []).append(f"chart not drawn: {e}")
    md = base.with_suffix(".md")
    md.write_text(markdown_suite(result) + (f"\n![rows]({png.name})\n" if png else ""))
    return paths + [md]


def machine_header(machine: dict) -> str:
    """One line: date-free machine facts for a report header."""
    keys = [
        ("accelerator", "{}"),
        ("driver", "driver {}"),
        ("cpu", "{}"),
        ("cores", "{} cores"),
        ("jax", "jax {}"),
        ("jax_backend", "backend {}"),
        ("torch", "torch {}"),
        ("transformers", "transformers {}"),
    ]
    return " · ".join(f.format(machine[k]) for k, f in keys if machine.get(k) is not None)


_MD_COLUMNS = [
    ("vehicle", "vehicle", "{}"),
    ("method", "method", "{}"),
    ("batch", "batch", "{}"),
    ("temperature", "T", "{:g}"),
    ("new_tokens", "new tokens", "{}"),
    ("answer_tokens", "answer", "{}"),
    ("answer_distinct", "distinct", "{:.2f}"),
    ("answer_rep4", "rep. 4-gram", "{:.2f}"),
    ("seconds", "seconds", "{:.3f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
    ("speedup_vs_reference", "speedup", "{:.2f}x"),
    ("nfe", "NFE", "{}"),
    ("mat", "MAT", "{:.2f}"),
    ("nfe_ratio", "NFE ratio", "{:.2f}x"),
    ("identical_to_reference", "identical", "{}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("skipped", "skipped / error", "{}"),
]


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple]) -> list[str]:
    """Rows as a GitHub markdown table (``None`` -> ``-``, booleans yes / NO); only the
    columns some row has."""
    cols = [c for c in columns if any(r.get(c[0]) is not None for r in rows)]
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for k, _, fmt in cols:
            v = r.get(k)
            cells.append(
                "-"
                if v is None
                else ("yes" if v else "NO")
                if isinstance(v, bool)
                else fmt.format(v)
                if not isinstance(v, str)
                else v.replace("|", "/")
            )
        out.append("| " + " | ".join(cells) + " |")
    return out


def coverage(rows: Sequence[dict]) -> dict:
    """How many of a suite's planned rows ran: ``{"planned", "ran", "budget", "failed",
    "other"}`` (``budget``: rows skipped because the time budget ran out; ``failed``: rows
    whose ``skipped`` holds an error; ``other``: rows skipped for another reason, e.g. a peer
    that cannot run on the machine)."""
    out = {"planned": len(rows), "ran": 0, "budget": 0, "failed": 0, "other": 0}
    for r in rows:
        why = str(r.get("skipped") or "")
        if r.get("failed") or why.startswith("error"):
            out["failed"] += 1
        elif why.startswith("time budget"):
            out["budget"] += 1
        elif why:
            out["other"] += 1
        else:
            out["ran"] += 1
    return out


# What a reader must know about a vehicle before reading its rows (by preset name).
VEHICLE_NOTES = {
    "dream-smollm2-135m": (
        "dLLM vehicle: `dream-smollm2-135m` is the v2 LoRA delta "
        "(`checkpoints/dream-smollm2-135m-v2`), a 135M Dream-style adaptation that on these "
        "HumanEval prompts answers in a few tokens and fills the rest of the 256-position "
        "window with EOS padding (its CPU figures, with degeneracy: `results/dllm.md`, "
        "`checkpoints/dream-smollm2-135m-v2/eos-gate.json`). MAT and speedups of the dLLM "
        "rows are mostly measured on that padding: read them beside `answer`."
    ),
}
_SUITE_VEHICLE = {"methods-dllm": "dllm"}


def _coverage_lines(result: dict) -> list[str]:
    """The plain statement of how many planned rows ran and why the rest did not."""
    rows = result.get("rows") or []
    if not rows or not any("family" in r or "system" in r for r in rows):
        return []
    c = coverage(rows)
    text = f"**Rows: {c['ran']} of {c['planned']} planned rows ran.**"
    why = []
    if c["budget"]:
        cfg = result.get("config") or {}
        share = result.get("deadline_s")
        why.append(
            f"{c['budget']} did not run because the time budget ran out "
            f"(`--budget-s {cfg.get('budget_s', '?')}` for the whole run"
            + (f", this suite's share {share:.0f} s" if share is not None else "")
            + ")"
        )
    if c["failed"]:
        why.append(f"{c['failed']} failed (the row holds its error)")
    if c["other"]:
        why.append(f"{c['other']} could not run on this machine (the row says why)")
    if why:
        text += " " + "; ".join(why) + "."
    ran = [r for r in rows if "compile_s" in r and r.get("compile_s") is not None]
    if ran and c["budget"]:
        lo, hi = min(r["compile_s"] for r in ran), max(r["compile_s"] for r in ran)
        text += f" Each row that ran spent {lo:.1f}-{hi:.1f} s compiling."
    return [text, ""]


def _run_lines(result: dict) -> list[str]:
    """The run's suites and how each ended (from :func:`parse_run_log`), when recorded."""
    run = result.get("run") or {}
    parts = []
    for e in run.get("suites", []):
        s = f"`{e['suite']}` {e['status']}"
        if e.get("deadline_s") is not None:
            s += f" (share {e['deadline_s']:.0f} s)"
        parts.append(s)
    lines = [f"This run's suites, in order: {'; '.join(parts)}.", ""] if parts else []
    stages = [f"{e['stage']} ({e['deadline_s']:.0f} s)" for e in run.get("stages", [])]
    if stages:
        lines += [f"Stages and their shares of the budget: {', '.join(stages)}.", ""]
    return lines


def _vehicle_lines(result: dict) -> list[str]:
    vname = _SUITE_VEHICLE.get(result.get("suite"))
    preset = ((result.get("config") or {}).get("vehicles") or {}).get(vname)
    lines = [VEHICLE_NOTES[preset], ""] if preset in VEHICLE_NOTES else []
    measured = [r for r in result.get("rows") or [] if "seconds" in r]
    if measured and result.get("suite") in ("methods-causal", "methods-dllm"):
        if not any("answer_rep4" in r for r in measured):
            lines += [
                "This run recorded `answer` (tokens before the first EOS, summed over the "
                "batch's rows) for every row but no degeneracy figures (distinct-token share, "
                "repeated 4-gram rate): the suite did not compute them at the time.",
                "",
            ]
    return lines


def markdown_suite(result: dict) -> str:
    """The markdown page of one suite of the device run: header (date, accelerator, driver,
    JAX, torch), how many planned rows ran and why the rest did not, vehicle notes, config,
    the table and its notes."""
    lines = [
        f"# Device bench: `{result['suite']}`",
        "",
        f"{result['date']} · {machine_header(result['machine'])}",
        "",
    ]
    lines += _coverage_lines(result) + _run_lines(result) + _vehicle_lines(result)
    if result.get("config"):
        lines += ["Config: " + ", ".join(f"`{k}={v}`" for k, v in result["config"].items()), ""]
    if result.get("title"):
        lines += [result["title"], ""]
    lines += markdown_table(result.get("rows", []), result.get("columns") or _MD_COLUMNS)
    lines += [""] + [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def plot_suite(result: dict, out: Path) -> Path:
    """Bar chart of each measured row's speedup over its reference (or tok/s)."""
    from jaxspec.bench.report import save_figure
    from jaxspec.core.plotting import pyplot

    rows = [r for r in result["rows"] if r.get("speedup_vs_reference") or r.get("tokens_per_s")]
    key = (
        "speedup_vs_reference"
        if any(r.get("speedup_vs_reference") for r in rows)
        else "tokens_per_s"
    )
    rows = [r for r in rows if r.get(key)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(rows) + 2), 3.8))
    labels = [f"{r.get('method')} b{r.get('batch', '')} T{r.get('temperature', '')}" for r in rows]
    ax.bar(range(len(rows)), [r[key] for r in rows])
    ax.set_xticks(range(len(rows)), labels, rotation=75, fontsize=6)
    ax.set_ylabel(key.replace("_", " "))
    if key == "speedup_vs_reference":
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
    return save_figure(fig, out, f"{result['suite']} ({machine_header(result['machine'])})")


def bundle(out_dir: Path, target: Path, names: Sequence[str]) -> Path:
    """Tar the suites' files (``<name>.json/.md/.png`` under ``out_dir``) into one gzip file,
    written to a temporary name and renamed (a run cut off mid-write leaves the previous
    bundle whole): one of the 8 files a device call returns."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tf:
        for n in names:
            for ext in (".json", ".md", ".png"):
                p = Path(out_dir) / f"{n}{ext}"
                if p.is_file():
                    tf.add(p, arcname=p.name)
    tmp.replace(target)
    return target


def parse_run_log(text: str, suites: Sequence[str] = SUITES) -> dict:
    """What a device run's printed log says about its suites: ``{"suites": [{"suite",
    "status", "deadline_s"}]}`` in run order, status ``"ran"``, ``"crashed: <error line>"``
    (a traceback after the suite began) or ``"not reached"`` (planned, never begun).
    ``suites``: the planned suites (a result's ``config["suites"]``)."""
    import re

    started, deadline = [], {}
    for line in text.splitlines():
        m = re.match(r"\[device-bench\] suite (\S+): (\d+(?:\.\d+)?) s of", line)
        if m:
            started.append(m.group(1))
            deadline[m.group(1)] = float(m.group(2))
    crash = None
    if "Traceback (most recent call last)" in text:
        tail = text[text.rindex("Traceback (most recent call last)") :]
        for line in tail.splitlines():
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:", line):
                crash = " ".join(line.split(" Stack trace:")[0].split())[:200]
                break
        crash = crash or "a traceback"
    out = []
    for i, name in enumerate(started):
        last = i == len(started) - 1
        status = f"crashed: {crash}" if crash and last else "ran"
        out.append({"suite": name, "status": status, "deadline_s": deadline[name]})
    out += [{"suite": n, "status": "not reached"} for n in suites if n not in started]
    return {"suites": out}


def collect(bundle_path: Path, out_dir: Path, log_path: Optional[Path] = None) -> list[Path]:
    """Extract a bundle a device run returned into ``out_dir`` (e.g. ``results/gpu``); only
    plain ``.json`` / ``.md`` / ``.png`` members without folders are accepted. With
    ``log_path`` (the run's printed log), each suite's result gains ``run`` (every suite's
    share and how it ended: :func:`parse_run_log`) and ``deadline_s``, and its ``.json`` and
    ``.md`` are written again from the result (:func:`markdown_suite`: the header, how many
    planned rows ran and why the rest did not).

    Raises:
      PackError: a member of another kind or with a path, or a missing log."""
    out = []
    with tarfile.open(bundle_path, "r:gz") as tf:
        for m in tf.getmembers():
            kinds = (".json", ".md", ".png")
            if not m.isfile() or "/" in m.name or Path(m.name).suffix not in kinds:
                raise PackError(f"{bundle_path}: unexpected member {m.name!r}")
            tf.extract(m, out_dir, filter="data")
            out.append(Path(out_dir) / m.name)
    if log_path is not None and not Path(log_path).is_file():
        raise PackError(f"no run log at {log_path}")
    for p in [p for p in out if p.suffix == ".json"]:
        result = json.loads(p.read_text())
        if "suite" not in result or "machine" not in result:
            continue
        if log_path is not None and "run" not in result:
            planned = (result.get("config") or {}).get("suites") or list(SUITES)
            result["run"] = parse_run_log(Path(log_path).read_text(), planned)
            share = [e for e in result["run"]["suites"] if e["suite"] == result["suite"]]
            if share and share[0].get("deadline_s") is not None:
                result.setdefault("deadline_s", share[0]["deadline_s"])
        p.write_text(json.dumps(result, indent=2, default=str) + "\n")
        png = p.with_suffix(".png")
        p.with_suffix(".md").write_text(
            markdown_suite(result) + (f"\n![rows]({png.name})\n" if png.is_file() else "")
        )
    return out


def device_machine_info() -> dict:
    """:func:`jaxspec.bench.machine.machine_info` plus the GPU's driver version and name
    (``nvidia-smi``), when there is one."""
    from jaxspec.bench.machine import machine_info

    info = machine_info()
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if r.returncode == 0 and r.stdout.strip():
            name, driver, mem = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
            info.update(gpu=name, driver=driver, gpu_memory=mem)
            info.setdefault("accelerator", name)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return info


def now_iso() -> str:
    """The current UTC time, seconds precision."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
