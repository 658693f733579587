"""The persistent XLA compile cache (:mod:`jaxspec.core.compile_cache`): where it goes, how it is
turned off, and that the decoders' compile point (:func:`jaxspec.core.runtime.run_compiled`)
turns it on for library users who never call :func:`enable_persistent_cache` (checked in fresh
interpreters, since this test process already has the suite's cache configured)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxspec.core import compile_cache as cc

ROOT = Path(__file__).resolve().parents[2]

# a small, fast-compiling program: JAX's own thresholds (1 s) would not store it
PROGRAM = """
import jax, numpy as np
from jaxspec.core.runtime import run_compiled
out, _, _ = run_compiled(jax.jit(lambda x: x * 2 + 1), (np.arange(5, dtype=np.float32),), {})
assert out.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
print(jax.config.jax_compilation_cache_dir)
"""


def test_default_directory_and_switches(monkeypatch, tmp_path):
    for var in (cc.DIR_ENV, cc.ROOT_ENV, cc.DISABLE_ENV):
        monkeypatch.delenv(var, raising=False)
    assert cc.default_cache_dir() == Path.home() / ".cache" / "jaxspec" / "xla"
    monkeypatch.setenv(cc.ROOT_ENV, str(tmp_path / "root"))
    assert cc.default_cache_dir() == tmp_path / "root" / "xla"
    monkeypatch.setenv(cc.DIR_ENV, str(tmp_path / "mine"))
    assert cc.default_cache_dir() == tmp_path / "mine"
    assert not cc.cache_disabled()
    monkeypatch.setenv(cc.DIR_ENV, "off")
    assert cc.cache_disabled() and cc.enable_persistent_cache() is None
    monkeypatch.delenv(cc.DIR_ENV)
    monkeypatch.setenv(cc.DISABLE_ENV, "1")
    assert cc.cache_disabled() and cc.enable_persistent_cache() is None
    assert cc.enable_persistent_cache("off") is None


def _run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in (cc.DIR_ENV, cc.DISABLE_ENV, cc.ROOT_ENV, "JAX_COMPILATION_CACHE_DIR")
    }
    r = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **env},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _entries(d: Path) -> set[str]:
    return {p.name for p in d.rglob("*") if p.is_file()} if d.exists() else set()


def test_library_decoders_use_the_cache_by_default(tmp_path):
    """First process: the program is stored under $JAXSPEC_CACHE/xla. Second process: the same
    program is loaded, nothing new is stored. ``JAXSPEC_NO_COMPILE_CACHE=1``: nothing stored."""
    root = tmp_path / "cache-root"
    r = _run(tmp_path, JAXSPEC_CACHE=str(root))
    assert r.stdout.strip() == str(root / "xla")
    first = _entries(root / "xla")
    assert first, "nothing was stored"
    _run(tmp_path, JAXSPEC_CACHE=str(root))
    assert {e for e in _entries(root / "xla") if "atime" not in e} == {
        e for e in first if "atime" not in e
    }

    off = tmp_path / "off-root"
    r = _run(tmp_path, JAXSPEC_CACHE=str(off), JAXSPEC_NO_COMPILE_CACHE="1")
    assert r.stdout.strip() == "None" and not _entries(off)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_unwritable_cache_directory_warns_and_runs(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    r = _run(tmp_path, JAXSPEC_COMPILE_CACHE=str(ro / "xla"))
    assert r.stdout.strip() == "None"
    assert r.stderr.strip().startswith("warning: the XLA compile cache is off")


def test_unusable_cache_directory_warns_and_runs(tmp_path):
    """A cache path under a regular file: one warning line, the program still runs."""
    f = tmp_path / "a-file"
    f.write_text("x")
    r = _run(tmp_path, JAXSPEC_COMPILE_CACHE=str(f / "xla"))
    assert r.stdout.strip() == "None"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: the XLA compile cache is off"), lines
