"""Output lines shared by the command-line tools."""

from __future__ import annotations


def compare_line(method: str, reference: str, res, ref, verdict: str) -> str:
    """The ``[compare]`` line: output identity verdict, wall-clock speedup and NFE ratio of
    ``res`` (the method) against ``ref`` (its reference decoder)."""
    return (
        f"[compare] {method} vs {reference} outputs: {verdict}; wall-clock speedup "
        f"{ref.run_s / max(res.run_s, 1e-9):.2f}x; NFE ratio "
        f"{ref.stats.target_nfe.sum() / max(res.stats.target_nfe.sum(), 1):.2f}x"
    )


def add_compile_cache_flag(ap) -> None:
    """``--no-compile-cache`` on an argparse parser (:mod:`jaxspec.core.compile_cache`)."""
    ap.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="do not read or write the persistent XLA compile cache (default: "
        "$JAXSPEC_COMPILE_CACHE, else ~/.cache/jaxspec/xla; "
        "JAXSPEC_NO_COMPILE_CACHE=1 does the same)",
    )


def setup_compile_cache(args) -> str | None:
    """Turn the persistent XLA compile cache on (default) or off (``--no-compile-cache``)
    before anything compiles; returns the directory in use, or None."""
    from jaxspec.core.compile_cache import disable_persistent_cache, enable_persistent_cache

    if getattr(args, "no_compile_cache", False):
        disable_persistent_cache()
        return None
    return enable_persistent_cache()
