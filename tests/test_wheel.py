"""The wheel a user installs: built from this checkout, installed (not editable) into a new
virtual environment, and run from a folder outside the repository.

The new environment is made without pip and without the system site-packages; its only link to
this one is a ``.pth`` line naming this interpreter's site-packages, so the dependencies (JAX,
flax, tokenizers, ...) need no download, while ``jaxspec``, ``models``, ``scripts`` and their
data (``configs``, ``checkpoints``) must come from the wheel: a ``.pth`` line adds a folder to the
path but runs none of its ``.pth`` files, so the editable install of this checkout (a path hook
set up by a ``.pth`` file here) is not active there. ``pip install --no-deps --ignore-installed``
puts the wheel into the new environment and leaves this one alone.

The notebook's install cell (``notebooks/make_notebook.py``, cell 1) is run the same way, with
``JAXSPEC_WHEEL`` naming the wheel: the path a Colab user takes, from a wheel instead of a clone.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_OFFLINE = ("--no-deps", "--ignore-installed", "--no-index", "--disable-pip-version-check", "-q")


def _source_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files of the checkout (what a clone plus the
    working tree's edits hold), so a stale ``build/`` or a local training run never reaches the
    wheel; without git, every file."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and not {".venv", ".git", "build"} & set(p.relative_to(ROOT).parts)
        ]
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["JAX_PLATFORMS"] = "cpu"
    env["JAXSPEC_COMPILE_CACHE"] = jax.config.jax_compilation_cache_dir or "off"
    env["HOME"] = os.environ.get("HOME", str(tmp))
    return env


def _new_env(path: Path) -> Path:
    """A virtual environment without pip or system site-packages whose path ends with this
    interpreter's site-packages (module docstring); returns its python."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False, clear=True).create(path)
    py = path / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [str(py), "-c", where], capture_output=True, text=True, check=True
    ).stdout.strip()
    Path(site, "_jaxspec_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def _run(cmd, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``jaxspec-*.whl`` built by pip from a copy of the checkout's files."""
    src = tmp_path_factory.mktemp("src")
    for f in _source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    dist = tmp_path_factory.mktemp("dist")
    # this environment's setuptools when it has one (no download); else pip's isolated build
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    r = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            *isolation,
            "--disable-pip-version-check",
            "-q",
            "-w",
            dist,
            src,
        ],
        src,
        _env(src),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = dist.glob("jaxspec-*.whl")
    return whl


def test_wheel_installs_and_generates_outside_the_repository(wheel, tiny_llama, tmp_path):
    """Installed from the wheel: the packages and their data come from the new environment,
    every preset's files are there, and ``python -m scripts.generate`` decodes a tiny model
    (n-gram identical to AR) from a folder outside the repository."""
    py = _new_env(tmp_path / "venv")
    env = _env(tmp_path)
    r = _run([py, "-m", "pip", "install", *PIP_OFFLINE, wheel], tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()

    probe = (
        "import jaxspec, models, scripts, models.registry as R\n"
        "print(jaxspec.__file__); print(models.__file__); print(scripts.__file__)\n"
        "for n in R.available():\n"
        "    p = R.get_preset(n)\n"
        "    for f in (p.delta, p.train_config, p.checkpoint):\n"
        "        assert f is None or (R.REPO_ROOT / f).exists(), (n, f)\n"
        "print(len(R.available()))\n"
        "import models.llama.panels as P\n"
        "assert all(f.exists() for f in P._SOURCES), P._SOURCES  # the CPU kernels ship\n"
    )
    r = _run([py, "-c", probe], work, env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.split()
    venv_site = str(tmp_path / "venv")
    assert all(p.startswith(venv_site) for p in lines[:3]), lines  # not this checkout
    assert int(lines[3]) >= 9  # every preset of configs/models shipped

    r = _run(
        [
            py,
            "-m",
            "scripts.generate",
            "--model",
            "hf-directory",
            "--weights",
            tiny_llama.path,
            "--prompt",
            "def add(a, b):\n    return a + b\n\ndef add(",
            "--max-new-tokens",
            "12",
            "--method",
            "ngram",
            "--draft-length",
            "3",
            "--compare",
        ],
        work,
        env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[compare] ngram vs ar outputs: identical" in r.stdout, r.stdout
    assert not (work / "runs").exists() and list(work.iterdir()) == []  # wrote nothing here

    r = _run([py, "-m", "scripts.benchmark", "--suite", "ar", "--limit", "0"], work, env)
    assert r.returncode == 2 and r.stderr.strip() == "error: --limit must be >= 1, got 0"


def _install_cell() -> str:
    spec = importlib.util.spec_from_file_location(
        "make_notebook", ROOT / "notebooks" / "make_notebook.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.INSTALL


def test_notebook_install_cell_installs_the_wheel(wheel, tmp_path):
    """Cell 1 of the notebook with ``JAXSPEC_WHEEL``: jaxspec is not importable before it
    and is importable from the new environment's site-packages after it, in the same
    interpreter (as in a Colab kernel)."""
    py = _new_env(tmp_path / "venv")
    env = {**_env(tmp_path), "JAXSPEC_WHEEL": str(wheel), "JAXSPEC_PIP_ARGS": " ".join(PIP_OFFLINE)}
    env.pop("JAXSPEC_NOTEBOOK_TEST", None)
    cell = _install_cell()
    check = (
        "\nimport importlib.util\n"
        "spec = importlib.util.find_spec('jaxspec')\n"
        "print('INSTALLED', spec.origin)\n"
        "import models.registry\n"
        "print('PRESETS', len(models.registry.available()))\n"
    )
    before = _run(
        [py, "-c", "import importlib.util; print(importlib.util.find_spec('jaxspec'))"],
        tmp_path,
        env,
    )
    assert before.stdout.strip() == "None", before.stdout
    r = _run([py, "-c", cell + check], tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    origin = next(
        line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("INSTALLED")
    )
    assert origin.startswith(str(tmp_path / "venv")), r.stdout
    assert "install skipped" not in r.stdout
