"""The prepared device run (scripts.device_bench, jaxspec.bench.device / peers / projection):
pack -> verify -> unpack -> run in smoke mode on the CPU, sha256 failures, the carry plan,
the peers harness on a tiny HF model and the projection's cost model."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest

from jaxspec.bench import device, projection
from scripts import device_bench

MiB = device.MiB


def _file(path, n, seed=0):
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())
    return path


def _pack_of(tmp_path, sizes, part_max):
    """A pack of random files (no vehicles) split into ``part_max``-byte parts."""
    pack = tmp_path / "pack"
    arts = [
        device.split_file(
            _file(tmp_path / f"a{i}.bin", n, i), pack, f"a{i}", f"x/a{i}.bin", part_max
        )
        for i, n in enumerate(sizes)
    ]
    device.write_manifest(pack, arts, {"task_ids": []}, {})
    return pack


def test_parts_join_back_to_the_same_bytes(tmp_path):
    pack = _pack_of(tmp_path, [10_000, 4096, 1], part_max=4096)
    m = device.verify_pack(pack)
    assert [len(a["parts"]) for a in m["artifacts"]] == [3, 1, 1]
    assert all(p["size"] <= 4096 for a in m["artifacts"] for p in a["parts"])
    out = device.unpack(pack, tmp_path / "out")
    for i in range(3):
        assert out[f"a{i}"].read_bytes() == (tmp_path / f"a{i}.bin").read_bytes()


def test_corrupt_or_missing_part_is_a_one_line_error(tmp_path, capsys):
    pack = _pack_of(tmp_path, [10_000], part_max=4096)
    part = pack / "parts" / "a0.01"
    data = bytearray(part.read_bytes())
    data[17] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(device.PackError, match=r"a0: .*a0\.01 fails its sha256 check"):
        device.verify_pack(pack)
    assert device_bench.main(["verify", "--pack-dir", str(pack)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: a0:") and "sha256" in err[0]
    part.unlink()
    with pytest.raises(device.PackError, match="a0.01 missing"):
        device.verify_pack(pack)


def test_staged_parts_complete_a_pack(tmp_path):
    pack = _pack_of(tmp_path, [9000], part_max=4096)
    stage = tmp_path / "stage"
    assert device.stage_parts(pack, stage) == ["parts/a0.00", "parts/a0.01", "parts/a0.02"]
    (pack / "parts" / "a0.00").unlink()  # an earlier call carried it
    with pytest.raises(device.PackError):
        device.verify_pack(pack)
    out = device.unpack(pack, tmp_path / "out", stage_dirs=[stage])
    assert out["a0"].read_bytes() == (tmp_path / "a0.bin").read_bytes()


def test_carry_plan_fits_every_call_under_the_limit(tmp_path):
    m = {
        "artifacts": [
            {
                "parts": [
                    {"file": f"p{i}", "size": s}
                    for i, s in enumerate([30 * MiB, 30 * MiB, 10 * MiB])
                ]
            }
        ],
        "prompts": {"file": "prompts.json", "size": 1000},
        "wheels": [],
    }
    plan = device.carry_plan(m, tree_bytes=20 * MiB)
    assert plan["fits"]
    assert sorted(f for c in plan["calls"] for f in c if f[:1] == "p" and len(f) == 2) == [
        "p0",
        "p1",
        "p2",
    ]
    assert all(b <= device.CARRY_MAX_BYTES for b in plan["call_bytes"])
    assert device.MANIFEST in plan["calls"][-1]  # the last call runs the bench
    big = device.carry_plan(m, tree_bytes=70 * MiB)
    assert not big["fits"] and "working tree alone is 70.0 MiB" in big["reason"]
    tight = device.carry_plan(m, tree_bytes=40 * MiB)
    assert not tight["fits"] and "does not fit" in tight["reason"]


def test_entries_put_greedy_batch_1_first_and_keep_references():
    s = device.RunSettings(batches=(1, 8), temperatures=(0.0, 1.0), methods=("ngram", "space"))
    e = device._entries("causal", {"causal": None, "space": None}, s)
    assert e[:4] == [
        ("ar", "causal", 1, 0.0),
        ("ngram", "causal", 1, 0.0),
        ("ar", "space", 1, 0.0),
        ("space", "space", 1, 0.0),
    ]
    assert {m for m, *_ in e} == {"ar", "ngram", "space"} and len(e) == 16
    smoke = device._entries("dllm", {"dllm": None}, device.RunSettings.smoke())
    assert [(m, b, t) for m, _, b, t in smoke if (b, t) != (1, 0.0)] == [
        ("stepwise", 8, 0.0),
        ("fixed-k", 8, 0.0),
        ("stepwise", 1, 1.0),
        ("fixed-k", 1, 1.0),
        ("stepwise", 8, 1.0),
        ("fixed-k", 8, 1.0),
    ]


def test_budget_shares_out_what_is_left():
    b = device.Budget(100.0, reserve_s=0.0)
    assert b.share([0.55, 0.15, 0.3]) == pytest.approx(55.0, rel=0.05)
    assert b.share([0.1]) == pytest.approx(100.0, rel=0.05)


def test_stages_run_every_greedy_batch_1_row_first_across_suites():
    s = device.RunSettings()
    labels = [st["label"] for st in device.stage_plan(device.SUITES, s)]
    assert labels == ["b1 T0", "peers", "projection", "b8 T0", "b1 T1", "b8 T1"]
    first = device.stage_plan(device.SUITES, s)[0]
    assert first["families"] == ["causal", "dllm", "asarm"] and first["pair"] == (0.0, 1)
    only = device.stage_plan(["methods-asarm", "projection"], s)
    assert [st["label"] for st in only] == ["b1 T0", "projection", "b8 T0", "b1 T1", "b8 T1"]
    assert only[0]["families"] == ["asarm"]


def test_a_stage_takes_the_families_in_turn_and_skips_by_family(monkeypatch):
    took = {"causal": 0.03, "dllm": 0.0, "asarm": 0.0}
    ran = []

    def fake_entry(m, family, vehicle, vehicles, prompts, b, t, s):
        import time

        ran.append((family, m))
        time.sleep(took[family])
        return {
            "vehicle": vehicle,
            "family": family,
            "method": m,
            "batch": b,
            "temperature": t,
            "seconds": 0.01,
            "tokens_per_s": 1.0,
            "mat": 1.0,
            "nfe": 1,
            "new_tokens": 1,
            "reference": m,
            "_tokens": [[1]],
        }

    monkeypatch.setattr(device.run, "run_entry", fake_entry)
    monkeypatch.setattr(device.run, "_finish_rows", lambda rows: None)
    vehicles = {"causal": "causal", "space": "space", "dllm": "dllm", "asarm": "asarm"}
    s = device.RunSettings(methods=("ngram", "sps", "fixed-k", "ssd", "assd"))
    rows, emitted = {}, []
    device.run_methods_stage(
        ["causal", "dllm", "asarm"],
        (0.0, 1),
        vehicles,
        {},
        s,
        60.0,
        rows,
        log=lambda m: None,
        on_row=emitted.append,
    )
    assert ran[:6] == [
        ("causal", "ar"),
        ("dllm", "stepwise"),
        ("asarm", "sequential"),
        ("causal", "ngram"),
        ("dllm", "fixed-k"),
        ("asarm", "assd"),
    ]
    assert {r["batch"] for f in rows for r in rows[f]} == {1}
    assert len(emitted) == sum(len(v) for v in rows.values())
    # a budget under the causal rows' time skips them but still runs the faster families'
    ran.clear()
    rows2 = {}
    device.run_methods_stage(
        ["causal", "dllm", "asarm"],
        (0.0, 8),
        vehicles,
        {},
        s,
        2.0,
        rows2,
        slowest={"causal": 5.0},
        log=lambda m: None,
    )
    assert all("time budget" in r["skipped"] for r in rows2["causal"])
    assert all("seconds" in r for r in rows2["dllm"] + rows2["asarm"])
    assert ("dllm", "ssd") in ran and not any(f == "causal" for f, _ in ran)


def test_jax_cache_goes_back_in_parts_and_comes_in_with_the_pack(tmp_path):
    import os

    from jaxspec.core.compile_cache import TIMINGS_FILE

    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    _file(cache / TIMINGS_FILE, 100, 9)
    for i in range(5):  # 5 entries of 0.9 MiB, oldest first
        f = _file(cache / ("sub" if i % 2 else "") / f"e{i}", int(0.9 * MiB), i)
        os.utime(f, (1000 + i, 1000 + i))
    out = tmp_path / "OUT"
    info = device.export_jax_cache(
        cache, out, max_bytes=3 * MiB, part_bytes=MiB, meta={"jax": "0.11.2"}
    )
    assert info["entries"] == 4 and info["left_out"] == 2 and info["jax"] == "0.11.2"
    parts = sorted(out.glob("jax-cache.tar.*"))
    assert [p.name for p in parts] == [p["file"] for p in info["parts"]] and len(parts) == 3
    assert all(p.stat().st_size <= MiB for p in parts)
    assert sum(p.stat().st_size for p in parts) == info["bytes"] <= 3 * MiB
    pack = tmp_path / "pack"
    assert (
        device_bench.main(
            ["pack", "--smoke", "--no-hf", "--pack-dir", str(pack), "--jax-cache-from", str(out)]
        )
        == 0
    )
    m = device.read_manifest(pack)
    art = next(a for a in m["artifacts"] if a["name"] == device.JAX_CACHE_ARTIFACT)
    assert art["optional"] and art["meta"]["jax"] == "0.11.2"
    plan = device.carry_plan(m, tree_bytes=MiB)
    assert {p["file"] for p in art["parts"]} <= {f for c in plan["calls"] for f in c}
    joined = device.unpack(pack, tmp_path / "un")[device.JAX_CACHE_ARTIFACT]
    fresh = tmp_path / "fresh"
    assert device.extract_jax_cache(joined, fresh) == 4
    for name in (TIMINGS_FILE, "e0", "sub/e1", "e2"):  # the timings, then the oldest
        assert (fresh / name).read_bytes() == (cache / name).read_bytes()
    assert not (fresh / "sub" / "e3").exists()
    # a cache part that did not travel leaves the cache out, not the run
    for p in art["parts"]:
        (pack / p["file"]).unlink()
    assert device.verify_pack(pack)["left_out"] == [device.JAX_CACHE_ARTIFACT]
    # a corrupt returned part is a one-line error
    data = bytearray(parts[0].read_bytes())
    data[5] ^= 1
    parts[0].write_bytes(bytes(data))
    with pytest.raises(device.PackError, match="jax-cache.tar.00 fails its sha256"):
        device.join_returned_cache(out, tmp_path / "j.tar")
    with pytest.raises(device.PackError, match="over the 1 MiB bound"):
        device.join_returned_cache(out, tmp_path / "j.tar", max_bytes=MiB)


def test_smoke_pack_and_run_write_every_suite(tmp_path, capsys):
    pack, out, bundle = tmp_path / "pack", tmp_path / "out", tmp_path / "b.tgz"
    assert (
        device_bench.main(
            ["pack", "--smoke", "--no-hf", "--pack-dir", str(pack), "--part-max-mib", "0.05"]
        )
        == 0
    )
    m = device.read_manifest(pack)
    assert any(len(a["parts"]) > 1 for a in m["artifacts"])
    suites = ["methods-causal", "methods-dllm", "methods-asarm"]  # projection: below
    assert (
        device_bench.main(
            [
                "run",
                "--smoke",
                "--pack-dir",
                str(pack),
                "--out-dir",
                str(out),
                "--budget-s",
                "40",
                "--bundle",
                str(bundle),
                "--suite",
                *suites,
            ]
        )
        == 0
    )
    for suite in suites:
        res = json.loads((out / f"{suite}.json").read_text())
        assert res["suite"] == suite and res["machine"].get("jax")
        md = (out / f"{suite}.md").read_text()
        assert md.startswith(f"# Device bench: `{suite}`") and "jax " in md
    for suite, ref in (
        ("methods-causal", "ar"),
        ("methods-dllm", "stepwise"),
        ("methods-asarm", "sequential"),
    ):
        rows = json.loads((out / f"{suite}.json").read_text())["rows"]
        ran = [r for r in rows if "seconds" in r]
        assert ran and ran[0]["method"] == ref and ran[0]["batch"] == 1
        # every row either ran or says why not; greedy lossless rows equal their reference
        assert all("seconds" in r or r.get("skipped") for r in rows)
        for r in ran:
            assert r["new_tokens"] > 0 and r["nfe"] > 0
            if r["temperature"] == 0.0 and r["lossless"]:
                assert r["identical_to_reference"] is True, r
    with tarfile.open(bundle) as tf:
        names = set(tf.getnames())
    assert {f"{s}.json" for s in suites} <= names and {f"{s}.md" for s in suites} <= names
    got = device.collect(bundle, tmp_path / "collected")
    assert {p.name for p in got} == names


def test_run_rejects_a_corrupt_pack_in_one_line(tmp_path, capsys):
    pack = tmp_path / "pack"
    assert (
        device_bench.main(
            ["pack", "--smoke", "--no-hf", "--pack-dir", str(pack), "--part-max-mib", "0.05"]
        )
        == 0
    )
    part = sorted((pack / "parts").iterdir())[3]
    data = bytearray(part.read_bytes())
    data[0] ^= 1
    part.write_bytes(bytes(data))
    capsys.readouterr()
    assert (
        device_bench.main(
            [
                "run",
                "--smoke",
                "--pack-dir",
                str(pack),
                "--out-dir",
                str(tmp_path / "out"),
                "--suite",
                "methods-asarm",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fails its sha256 check" in err[0] and part.name in err[0]
    assert (
        device_bench.main(
            ["run", "--smoke", "--pack-dir", str(pack), "--budget-s", "0", "--suite", "projection"]
        )
        == 2
    )
    assert (
        device_bench.main(
            [
                "run",
                "--smoke",
                "--pack-dir",
                str(pack),
                "--methods",
                "nope",
                "--suite",
                "projection",
            ]
        )
        == 2
    )
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_peers_on_a_tiny_hf_model(tmp_path):
    from jaxspec.bench import peers

    why = peers.transformers_available()
    if why:
        pytest.skip(why)
    try:
        files, vehicles = device.smoke_vehicles(tmp_path / "w", hf=True)
    except Exception as e:  # noqa: BLE001 - transformers cannot build a model from config here
        pytest.skip(f"transformers cannot build a tiny model locally: {e}")
    pack = tmp_path / "pack"
    arts = [device.split_file(p, pack, n, d) for n, p, d in files]
    device.write_manifest(pack, arts, device.smoke_prompts(vehicles["vocab"]), vehicles, smoke=True)
    root = tmp_path / "un"
    device.unpack(pack, root)
    (root / device.PROMPTS).write_text((pack / device.PROMPTS).read_text())
    vs = device.load_vehicles(device.read_manifest(pack), root, log=lambda m: None)
    prompts = json.loads((root / device.PROMPTS).read_text())
    res = peers.run_peers_suite(
        vs, prompts, device.RunSettings.smoke(), 600.0, compile=False, limit=1, log=lambda m: None
    )
    rows = {(r["system"], r["method"]): r for r in res["rows"]}
    for key in [
        ("jaxspec", "ar"),
        ("jaxspec", "ngram"),
        ("jaxspec", "sps"),
        ("transformers", "ar-static"),
        ("transformers", "prompt-lookup"),
        ("transformers", "assisted"),
    ]:
        assert key in rows and isinstance(rows[key]["identical_to_reference"], bool), key
    # lossless systems on the same float32 weights: the same tokens as jaxspec AR
    for key in [("jaxspec", "ngram"), ("jaxspec", "sps"), ("transformers", "ar-static")]:
        assert rows[key]["identical_to_reference"], key
    llada = [r for r in res["rows"] if r["method"].startswith("llada ")]  # official decoders
    assert len(llada) == len(peers.LLADA_SETTINGS), llada
    assert all(r.get("skipped") or r["identical_to_reference"] is True for r in llada), llada
    dream = rows[peers.DREAM_PEER]  # the official decoder when third_party/Fast-dLLM is here
    assert dream.get("skipped") or dream["identical_to_reference"] is True, dream
    alone = res["ar_before_peers"]  # jaxspec AR timed before the torch peers were loaded
    assert alone["tokens_per_s"] > 0 and len(alone["per_prompt"]) == 1
    assert any(n.startswith("`jaxspec/ar` timed alone") for n in res["notes"]), res["notes"]


def test_projection_cost_model_uses_the_papers_mat():
    t = {
        "Qwen2.5-32B": {"q1": 0.030, "q9": 0.033, "q6": 0.032, "q31": 0.045, "q36": 0.05},
        "Qwen2.5-7B": {"q1": 0.008},
        "Dream-7B": {"q30": 0.012},
    }
    rows = {r["method"]: r for r in projection.project(t, ["Qwen2.5-32B"])}
    d = rows["diffuspec"]
    assert d["paper_mat"] == 6.99 and d["paper_speedup"] == 3.08
    assert d["projected_speedup_paper_mat"] == pytest.approx(0.030 * 6.99 / (0.045 + 0.012))
    s = rows["sps"]
    assert s["projected_speedup_paper_mat"] == pytest.approx(0.030 * 6.18 / (0.032 + 5 * 0.008))
    assert rows["ngram"]["projected_speedup_paper_mat"] == pytest.approx(0.030 * 2.11 / 0.033)
    measured = [
        {
            "vehicle": "causal",
            "family": "causal",
            "method": "ngram",
            "batch": 1,
            "temperature": 0.0,
            "mat": 1.5,
        }
    ]
    ng = {r["method"]: r for r in projection.project(t, ["Qwen2.5-32B"], measured)}["ngram"]
    assert ng["projected_speedup_vehicle_mat"] == pytest.approx(0.030 * 1.5 / 0.033)


def test_projection_tiny_shapes_time_every_pass():
    res = projection.run_projection_suite("tiny", reps=1, log=lambda m: None)
    times = res["pass_seconds"]
    for name in ("tiny-causal", "tiny-dllm", "tiny-draft"):
        labels = {lab for lab, _, _ in projection.passes_for(projection.SHAPES[name])}
        assert set(times[name]) == labels and all(v > 0 for v in times[name].values())
    assert {r["method"] for r in res["rows"]} >= {"ngram", "sps", "space", "ssd", "spiffy"}
    assert "projection" in res["notes"][0].lower()
    with pytest.raises(projection.ProjectionError, match="unknown --shapes"):
        projection.run_projection_suite("huge")


_LOG = """[device-bench] NVIDIA H200 · driver 580
[device-bench] suite methods-causal: 117 s of 389 s left
[causal 1/32] causal/ar b1 T0: 933.1 tok/s, MAT 1.00 (14.7 s)
[device-bench] suite peers: 93 s of 163 s left
Traceback (most recent call last):
  File "x.py", line 1, in <module>
RuntimeError: Error: accessing tensor output of CUDAGraphs. Stack trace: File "y.py"
    more lines
"""


def test_run_log_names_each_suites_share_and_end():
    run = device.parse_run_log(_LOG, ["methods-causal", "peers", "projection"])
    assert run["suites"] == [
        {"suite": "methods-causal", "status": "ran", "deadline_s": 117.0},
        {
            "suite": "peers",
            "status": "crashed: RuntimeError: Error: accessing tensor output of CUDAGraphs.",
            "deadline_s": 93.0,
        },
        {"suite": "projection", "status": "not reached"},
    ]
    ok = device.parse_run_log(_LOG.split("Traceback")[0], ["methods-causal", "peers"])
    assert [e["status"] for e in ok["suites"]] == ["ran", "ran"]


def test_collect_rewrites_the_header_with_coverage(tmp_path):
    rows = [
        {
            "vehicle": "dllm",
            "family": "dllm",
            "method": "stepwise",
            "batch": 1,
            "temperature": 0.0,
            "seconds": 0.3,
            "answer_tokens": 2,
            "compile_s": 17.0,
        },
        {
            "vehicle": "dllm",
            "family": "dllm",
            "method": "ssd",
            "batch": 8,
            "temperature": 0.0,
            "skipped": "time budget: 14 s left, the slowest entry took 18 s",
        },
        {
            "vehicle": "dllm",
            "family": "dllm",
            "method": "spiffy",
            "batch": 8,
            "temperature": 0.0,
            "skipped": "error: ValueError: bad",
        },
    ]
    res = {
        "suite": "methods-dllm",
        "date": "2026-11-27T21:36:57+00:00",
        "machine": {
            "accelerator": "NVIDIA H200",
            "driver": "580",
            "jax": "0.11.2",
            "torch": "2.11.0",
        },
        "config": {
            "budget_s": 430.0,
            "suites": ["methods-dllm", "peers"],
            "vehicles": {"dllm": "dream-smollm2-135m"},
        },
        "rows": rows,
    }
    assert device.coverage(rows) == {"planned": 3, "ran": 1, "budget": 1, "failed": 1, "other": 0}
    src = tmp_path / "r"
    src.mkdir()
    (src / "methods-dllm.json").write_text(json.dumps(res))
    bundle = tmp_path / "b.tgz"
    with tarfile.open(bundle, "w:gz") as tf:
        tf.add(src / "methods-dllm.json", arcname="methods-dllm.json")
    log = tmp_path / "run.log"
    log.write_text(_LOG.replace("methods-causal", "methods-dllm"))
    assert (
        device_bench.main(
            ["collect", str(bundle), "--out-dir", str(tmp_path / "o"), "--log", str(log)]
        )
        == 0
    )
    md = (tmp_path / "o" / "methods-dllm.md").read_text()
    assert "NVIDIA H200 · driver 580" in md and "jax 0.11.2" in md and "torch 2.11.0" in md
    assert "**Rows: 1 of 3 planned rows ran.** 1 did not run because the time budget" in md
    assert "this suite's share 117 s" in md and "1 failed" in md
    assert "`peers` crashed: RuntimeError" in md
    assert "v2 LoRA delta" in md and "no degeneracy figures" in md
    got = json.loads((tmp_path / "o" / "methods-dllm.json").read_text())
    assert got["deadline_s"] == 117.0 and got["rows"] == rows


def test_answer_degeneracy_cuts_at_the_first_eos():
    figs = device.answer_degeneracy([[5, 6, 5, 6, 5, 6, 2, 9], [2, 7]], eos_ids=[2])
    # one answer [5, 6, 5, 6, 5, 6]: 2 distinct of 6; 4-grams 5656 6565 5656 -> 1 of 3 repeated
    assert figs == {
        "answer_distinct": pytest.approx(1 / 3, abs=1e-4),
        "answer_rep4": pytest.approx(1 / 3, abs=1e-4),
    }
    assert device.answer_degeneracy([[2]], eos_ids=[2]) == {}


def _real_like_manifest(parts_mib, cache_mib=()):
    """A manifest shaped like the real pack's: the GGUF in parts, optionally a JAX cache."""
    arts = [
        {
            "name": "smollm2-gguf",
            "parts": [
                {"file": f"parts/smollm2-gguf.{i:02d}", "size": int(s * MiB)}
                for i, s in enumerate(parts_mib)
            ],
        }
    ]
    if cache_mib:
        arts.append(
            {
                "name": device.JAX_CACHE_ARTIFACT,
                "optional": True,
                "kind": "jax-cache",
                "parts": [
                    {"file": f"parts/jax-cache.{i:02d}", "size": int(s * MiB)}
                    for i, s in enumerate(cache_mib)
                ],
            }
        )
    return {
        "artifacts": arts,
        "prompts": {"file": "prompts.json", "size": 17356},
        "wheels": [{"file": "wheels/gguf.whl", "size": 118475}],
        "vehicles": {
            k: {"kind": "preset", "family": device._REAL_FAMILY[k], "preset": v}
            for k, v in device.REAL_VEHICLES.items()
        },
    }


_CKPT = {  # bytes of the checkpoint folders on 2026-11-27
    "checkpoints/smollm2-135m-space": 21_044_387,
    "checkpoints/dream-smollm2-135m-v2": 19_759_751,
    "checkpoints/asarm-small": 14_742_393,
    "device_pack/manifest.json": 2_000,
}


def test_session_plan_untracks_an_oversized_tree_and_fits_every_call(tmp_path):
    m = _real_like_manifest([56, 37.8], cache_mib=[16, 16, 4])
    plan = device.session_plan(
        m, tmp_path, tree_bytes=98 * MiB, untracked_tree_bytes=3 * MiB, sizes=dict(_CKPT)
    )
    assert plan["fits"], plan["reason"]
    assert plan["untrack"] == [
        "git rm -r -q --cached checkpoints results",
        "printf '%s\\n' /checkpoints/ /results/ >> .git/info/exclude",
    ]
    assert plan["restore"][:2] == [
        "sed -i '\\#^/checkpoints/$#d; \\#^/results/$#d' .git/info/exclude",
        "git reset -q -- checkpoints results",
    ]
    calls = plan["calls"]
    sizes = {**_CKPT, "device_pack/prompts.json": 17356, "device_pack/wheels": 118475}
    for a in m["artifacts"]:
        sizes.update({f"device_pack/{p['file']}": p["size"] for p in a["parts"]})
    for c in calls:
        assert len(c["carry"]) <= device.CARRY_MAX_PATHS
        assert c["bytes"] == 3 * MiB + sum(sizes[f] for f in c["carry"])
        assert c["bytes"] <= device.CARRY_MAX_BYTES
    run = calls[-1]
    assert run["what"] == "run" and all(c["what"] == "stage" for c in calls[:-1])
    assert "device_pack/prompts.json" in run["carry"] and "device_pack/wheels" in run["carry"]
    assert {
        "checkpoints/smollm2-135m-space",
        "checkpoints/dream-smollm2-135m-v2",
        "checkpoints/asarm-small",
    } <= set(run["carry"])
    assert run["command"].startswith("PYTHONUNBUFFERED=1 python3 -m scripts.device_bench run")
    assert "--stage-dir /tmp/stage" in run["command"] and run["timeout_s"] == 600
    assert all("device_pack/manifest.json" in c["carry"] for c in calls)
    carried = [f for c in calls for f in c["carry"] if "/parts/" in f]
    assert sorted(carried) == sorted(f for f in sizes if "/parts/" in f)  # each part once
    # a tree that fits carries its checkpoints itself: nothing untracked, one call
    small = device.session_plan(
        _real_like_manifest([10]), tmp_path, tree_bytes=30 * MiB, sizes=dict(_CKPT)
    )
    assert small["fits"] and not small["untrack"] and len(small["calls"]) == 1
    assert not any(f.startswith("checkpoints/") for f in small["calls"][0]["carry"])
    # a part too big beside the tree names the part size to pack with
    big = device.session_plan(
        _real_like_manifest([62]),
        tmp_path,
        tree_bytes=98 * MiB,
        untracked_tree_bytes=3 * MiB,
        sizes=dict(_CKPT),
    )
    assert not big["fits"] and "--part-max-mib 60" in big["reason"]


def test_plan_command_prints_every_call(tmp_path, capsys):
    pack = tmp_path / "pack"
    pack.mkdir()
    m = {**_real_like_manifest([56, 37.8]), "format": device.PACK_FORMAT, "total_bytes": 1}
    (pack / device.MANIFEST).write_text(json.dumps(m))
    assert device_bench.main(["plan", "--pack-dir", str(pack)]) == 0
    out = capsys.readouterr().out
    assert out.count("    carry: [") == out.count("    command: ") >= 1
    assert "scripts.device_bench run --budget-s 540" in out and "prompts.json" in out


def test_dflash_rows_use_the_carried_trained_drafter(tmp_path):
    """The ``dflash`` rows load the drafter the pack carried (same spec and weights, loaded
    once), a random block-16 drafter without one, and refuse a drafter of another target in
    one line."""
    import jax

    from jaxspec.causal.dflash import DFlashSpec, init_drafter, save_drafter
    from jaxspec.testing.tiny import tiny_model

    model, params = tiny_model(64, seed=0)
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    own = init_drafter(spec, seed=5)
    save_drafter(tmp_path / "d.safetensors", spec, own)
    v = device.Vehicle("causal", "causal", model, params, extra={})
    v.extra["dflash_file"] = tmp_path / "d.safetensors"
    got_spec, got_own = device.dflash_drafter(v)
    assert got_spec == spec and device.dflash_drafter(v)[1] is got_own
    jax.tree_util.tree_map(np.testing.assert_array_equal, got_own, own)
    bare = device.Vehicle("causal", "causal", model, params, extra={})
    assert device.dflash_drafter(bare)[0].block_size == 16
    other = tiny_model(48, seed=0)[0]
    wrong = DFlashSpec.for_target(other.config, block_size=4, layer_ids=(0, 1))
    save_drafter(tmp_path / "w.safetensors", wrong, init_drafter(wrong))
    v2 = device.Vehicle("causal", "causal", model, params, extra={})
    v2.extra["dflash_file"] = tmp_path / "w.safetensors"
    with pytest.raises(ValueError):
        device.dflash_drafter(v2)
