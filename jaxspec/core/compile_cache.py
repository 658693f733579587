"""JAX's persistent compilation cache, on by default for every entry point and decoder.

A compiled XLA program is written to disk and loaded by the next process that builds the same
program (same code, shapes, dtypes, shardings, backend and JAX version), so a second run of a
command pays the load (milliseconds per program) instead of the compile (seconds for the
unrolled CPU decode loops).

Where, in order of precedence:

1. the ``path`` argument of :func:`enable_persistent_cache`;
2. ``$JAXSPEC_COMPILE_CACHE`` (a directory);
3. ``$JAXSPEC_CACHE/xla`` (``$JAXSPEC_CACHE`` is the project's cache root, also used for
   training data and runs);
4. ``~/.cache/jaxspec/xla``.

Off: ``JAXSPEC_NO_COMPILE_CACHE=1``, ``JAXSPEC_COMPILE_CACHE=off``, ``path="off"``, or the
``--no-compile-cache`` flag of the command-line tools (which sets ``JAXSPEC_NO_COMPILE_CACHE``
for the process, so library calls made later stay off too).

Every program is stored, however small or fast to compile (JAX's own defaults skip programs
that compile in under a second: a run of many small programs then pays their compiles every
time). The cache directory is trusted code: do not point it at a folder others can write.

The command-line tools call :func:`enable_persistent_cache` before anything compiles; the
decoders call :func:`ensure_persistent_cache` before their first compile
(:func:`jaxspec.core.runtime.run_compiled`), so library users get the cache too. A directory
that was configured already (by the caller, e.g. the test suite, or by
``jax.config.update("jax_compilation_cache_dir", ...)``) is kept.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DISABLE_ENV = "JAXSPEC_NO_COMPILE_CACHE"
DIR_ENV = "JAXSPEC_COMPILE_CACHE"
ROOT_ENV = "JAXSPEC_CACHE"

_TRUE = ("1", "true", "yes", "on")
_checked = False


def default_cache_dir() -> Path:
    """``$JAXSPEC_COMPILE_CACHE``, else ``$JAXSPEC_CACHE/xla``, else ``~/.cache/jaxspec/xla``
    (the value ``off`` of the first is returned as is)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    root = os.environ.get(ROOT_ENV) or Path.home() / ".cache" / "jaxspec"
    return Path(root) / "xla"


def cache_disabled() -> bool:
    """Whether the environment turns the cache off (``JAXSPEC_NO_COMPILE_CACHE=1`` or
    ``JAXSPEC_COMPILE_CACHE=off``)."""
    return (
        os.environ.get(DISABLE_ENV, "").strip().lower() in _TRUE
        or os.environ.get(DIR_ENV, "").strip().lower() == "off"
    )


def disable_persistent_cache() -> None:
    """Turn the cache off for this process and its children (sets ``JAXSPEC_NO_COMPILE_CACHE``
    and clears a directory set earlier in this process)."""
    import jax

    os.environ[DISABLE_ENV] = "1"
    jax.config.update("jax_compilation_cache_dir", None)


def enable_persistent_cache(
    path: str | os.PathLike | None = None, min_compile_s: float = 0.0
) -> str | None:
    """Keep compiled XLA programs on disk so the next process loads them instead of compiling.

    Args:
      path: the cache directory (module docstring for the default), or ``"off"``. With
        ``None``, a directory already configured in this process is kept.
      min_compile_s: programs that compiled faster than this many seconds are not stored
        (default 0: every program; JAX's own default is 1 s).

    Returns:
      The directory in use, or None when the cache is off (by ``path="off"`` or the
      environment) or the directory cannot be created (a one-line ``warning:`` on stderr; the
      run goes on without the cache).
    """
    import jax

    if path is not None and str(path).lower() == "off":
        return None
    if path is None:
        if cache_disabled():
            return None
        if jax.config.jax_compilation_cache_dir:
            return jax.config.jax_compilation_cache_dir
        path = default_cache_dir()
    where = Path(path).expanduser()
    try:
        where.mkdir(parents=True, exist_ok=True)
        if not os.access(where, os.W_OK | os.X_OK):
            raise PermissionError(f"{where} is not writable")
    except OSError as e:
        print(
            f"warning: the XLA compile cache is off (cannot use {where}: {e}); set "
            f"{DIR_ENV}=DIR or {DISABLE_ENV}=1",
            file=sys.stderr,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", str(where))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(where)


def ensure_persistent_cache() -> str | None:
    """:func:`enable_persistent_cache` with its defaults, once per process (the decoders call
    this before compiling; later calls return the configured directory at once)."""
    global _checked
    if _checked:
        import jax

        return jax.config.jax_compilation_cache_dir
    _checked = True
    return enable_persistent_cache()


TIMINGS_FILE = "jaxspec-pass-timings.json"


def timing_store() -> Path | None:
    """The JSON file that keeps the decode plan's pass timings across processes
    (:func:`models.llama.layout.pass_seconds`): ``jaxspec-pass-timings.json`` inside the
    persistent compile cache's directory, so a machine times its verification layouts once and
    every later run picks the same layouts, whose programs the compile cache then holds. None
    when the compile cache is off (the timings then live for one process)."""
    where = ensure_persistent_cache()
    return None if where is None else Path(where) / TIMINGS_FILE


__all__ = [
    "DISABLE_ENV",
    "TIMINGS_FILE",
    "timing_store",
    "DIR_ENV",
    "ROOT_ENV",
    "default_cache_dir",
    "cache_disabled",
    "disable_persistent_cache",
    "enable_persistent_cache",
    "ensure_persistent_cache",
]
