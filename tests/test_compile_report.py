"""The opt-in compile-time plugin's summary (tests/compile_report.py) adds up JAX's events."""

import json

from tests.compile_report import summarise


def test_summary_adds_compile_seconds_by_file_test_and_program(tmp_path):
    compile_ev = "/jax/core/compile/backend_compile_duration"
    rows = [
        {"test": "tests/a.py::t1", "event": compile_ev, "fun": "jit(decode_loop)", "s": 2.0},
        {"test": "tests/a.py::t1", "event": "miss", "fun": "jit_decode_loop", "key": "k1"},
        {"test": "tests/a.py::t2", "event": compile_ev, "fun": "jit(decode_loop)", "s": 0.5},
        {"test": "tests/a.py::t2", "event": "hit", "fun": "jit_decode_loop", "key": "k1"},
        {
            "test": "tests/a.py::t2",
            "event": "avals",
            "fun": "jit(decode_loop)",
            "avals": "(i32[4],)",
        },
        {"test": "tests/b.py::t3", "event": compile_ev, "fun": "jit(add)", "s": 0.4},
        {"test": "tests/b.py::t3", "event": "/jax/core/compile/jaxpr_trace_duration", "s": 1.0},
        {
            "test": "tests/b.py::t3",
            "event": "/jax/compilation_cache/compile_time_saved_sec",
            "s": 9,
        },
    ]
    (tmp_path / "gw0-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = summarise(tmp_path)
    assert text.startswith("backend compiles (incl. cache loads): 3, 3 s; persistent cache")
    assert "misses 1 (1 test/program pairs)" in text
    assert "hits 1; tracing + lowering 1 s" in text
    assert "| tests/a.py | 2.5 | 0.0 |" in text and "| tests/b.py | 0.4 | 1.0 |" in text
    assert "| jit(decode_loop) | 2 | 2.5 | 1 | 1 |" in text
