"""The CPU panel kernel: few-row float32 products at the rate of a one-row product.

On the CPU every speculative decoder's verification pass multiplies ``K + 1`` query rows by
each weight matrix. XLA:CPU runs one row as a matrix-vector product at memory bandwidth, but
from two rows on it switches to matrix-matrix kernels that stream these narrow matrices at a
third to a half of that rate, so a 9-row pass cost 2.1-2.4 one-token steps
(docs/performance.md, "Verification passes on the CPU"). No XLA flag, layout or blocking
changed that.

This module packs a float32 matrix ``W`` ``(K, N)`` into 16-column **panels**
``(N / 16, K, 16)`` (each panel one contiguous stream) and multiplies by it with a small C++
kernel (``kernels/panel_matmul.cc``, an XLA FFI custom call): every panel is read once and
multiplied into up to 16 rows (AVX2: 12 float32 or 10 Q4_1 rows) held in vector registers, so
1 to 16 rows cost about the same
(SmolLM2-135M's layer products on a 2-core AMD EPYC: 9 rows 15.5 ms against XLA's 26.8 ms
input-major and 36.3 ms output-major, one row 13.7 ms against 14.9 / 15.1 ms;
``benchmarks/probes/panels/panel_micro.py``). Every output element is one chain of fused
multiply-adds over ``k`` in order, so a row's result does not depend on how many rows share
the call.

A float32 matrix that is exactly a dequantized GGUF block-quantized tensor is packed as its
own 4-bit / 8-bit codes with float32 block scales instead (:func:`pack_exact`), which the kernel
rebuilds exactly in registers: the same products bit for bit from 0.75-1.25 bytes a weight.
Q4_1, Q4_K and Q4_0 tensors go to Q4_1 panels (:func:`pack_q4`; every projection of the
default SmolLM2-135M file, most of Qwen2.5-Coder-1.5B's Q4_K_M), Q8_0 and Q5_0 to Q8 panels
with a scale per 32 inputs, Q6_K to Q8 panels with one per 16 (:func:`pack_q8`; SmolLM2's
tied head, most of Qwen2.5-Coder-0.5B's Q4_K_M). The blocks are found from the float32 values
alone and every weight checked. A one-row layer product of SmolLM2-135M: 5.2 against 14.9 ms
on float32 panels (docs/performance.md, "the GGUF file's own 4-bit weights").

The kernel is built on first use with the system's C++ compiler for this CPU
(``-O3 -march=native``) into ``$JAXSPEC_CACHE/kernels`` and registered with JAX. Where it
cannot be (no compiler, not x86-64 Linux, not the CPU backend) or :data:`PANELS` is False,
:func:`panels_active` is False and the decode layouts keep XLA's products; a model holding
panel weights then multiplies them with an XLA ``einsum`` (the same sums in another order).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

#: columns per panel (one 64-byte vector of float32)
PANEL = 16
#: the per-layer weight key suffix of a panel-packed matrix (``name + "_p"``)
SUFFIX = "_p"
#: force the panel layout on (True) or off (False) for the CPU's per-layer input-major
#: weights; None: :data:`ENV` decides (by default on where the CPU has AVX-512 or AVX2 with
#: FMA and the kernel builds: x86-64 Linux with a C++ compiler, CPU backend). Read when the
#: weights are laid out (:func:`panels_active`), so set it before decoding.
PANELS: Optional[bool] = None
#: environment switch read as the default of :data:`PANELS`: ``0`` turns the kernel off, ``1``
#: on wherever it builds, unset (or ``auto``) on where the CPU has AVX-512, or AVX2 and FMA
#: (:func:`vector_isa`). Without AVX2 the kernel's generic code is presumably slower than XLA's
#: products (not measured); without FMA its products are not the other builds' bits.
ENV = "JAXSPEC_PANELS"
#: pack Q4_1-exact (Q8_0-exact) matrices in Q4_1 (Q8_0) panels (:func:`pack_exact`); False
#: keeps float32 panels (the same products bit for bit, 5.3x (3.6x) the bytes). Its default:
#: ``$JAXSPEC_PANELS_Q4`` not 0.
Q4: bool = os.environ.get("JAXSPEC_PANELS_Q4", "1").strip().lower() not in ("0", "false", "off")

_TARGET = "jaxspec_panel_matmul"
_TARGET_Q4 = "jaxspec_panel_matmul_q4"
_TARGET_Q8 = "jaxspec_panel_matmul_q8"
_TARGET_Q8_16 = "jaxspec_panel_matmul_q8_16"
#: the FFI target of the cached attention (``kernels/cached_attention.cc``)
ATTENTION_TARGET = "jaxspec_cached_attention"
#: rows of ``W`` per Q4_1 scale block (GGUF's block size along the input axis)
Q4_BLOCK = 32
#: bytes of one Q4_1 panel block: 16 float32 ``d``, 16 float32 ``m``, 16 x 16 code bytes
Q4_BYTES = 2 * 4 * PANEL + Q4_BLOCK // 2 * PANEL
#: bytes of one Q8_0 panel block (blocks of :data:`Q4_BLOCK` rows): 16 float32 ``d``, 32 x 16
#: int8 codes
Q8_BYTES = 4 * PANEL + Q4_BLOCK * PANEL
#: rows of ``W`` per scale block of the 16-row Q8 panels (a GGUF Q6_K tensor's sub-blocks)
Q8_16_BLOCK = 16
#: bytes of one 16-row Q8 panel block: 16 float32 ``d``, 16 x 16 int8 codes
Q8_16_BYTES = 4 * PANEL + Q8_16_BLOCK * PANEL
#: the library's FFI targets and their handler symbols
_SYMBOLS = {
    _TARGET: "JaxspecPanelMatmul",
    _TARGET_Q4: "JaxspecPanelMatmulQ4",
    _TARGET_Q8: "JaxspecPanelMatmulQ8",
    _TARGET_Q8_16: "JaxspecPanelMatmulQ816",
    ATTENTION_TARGET: "JaxspecCachedAttention",
}
_SOURCE = Path(__file__).with_name("kernels") / "panel_matmul.cc"
#: the library's sources: the panel products and the cached attention
#: (:mod:`models.llama.attention`), built into one shared library
_SOURCES = (_SOURCE, _SOURCE.with_name("cached_attention.cc"))
_FLAGS = ("-O3", "-ffp-contract=fast", "-std=c++17", "-fPIC", "-shared")


def _flags(arch: str) -> tuple:
    return ("-O3", f"-march={arch}") + _FLAGS[1:]


_state: dict = {}
log = logging.getLogger(__name__)


class KernelBuildError(RuntimeError):
    """The panel kernel could not be compiled or loaded (the message has the compiler's)."""


def _cache_dir() -> Path:
    root = Path(os.environ.get("JAXSPEC_CACHE", Path.home() / ".cache" / "jaxspec"))
    return root / "kernels"


@functools.cache  # read by every panels_active() call; the CPU does not change
def _cpu_tag() -> str:
    """The CPU's model name and flags, which ``-march=native`` compiles for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return "\n".join(keep)


def vector_isa() -> Optional[str]:
    """``"avx512"`` where this CPU has AVX-512F, ``"avx2"`` where it has AVX2 and FMA, else None
    (``/proc/cpuinfo`` flags; None where they cannot be read): the CPUs where the kernel keeps
    its accumulators in vector registers (16 rows of one zmm, or 12 rows of one ymm per half
    panel) and beats XLA's products, so the default of :func:`panels_active`."""
    flags = set(_cpu_tag().split())
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else None


def library_path(arch: str = "native") -> Path:
    """Where the kernels' library for these sources, compiler flags (``-march=arch``), JAX
    version and CPU is cached."""
    h = hashlib.sha256()
    for part in (*(f.read_bytes() for f in _SOURCES), " ".join(_flags(arch)).encode()):
        h.update(part)
    h.update(jax.__version__.encode())
    h.update(_cpu_tag().encode())
    suffix = "" if arch == "native" else f"-{arch}"
    return _cache_dir() / f"panel_matmul-{h.hexdigest()[:16]}{suffix}.so"


def build(force: bool = False, arch: str = "native") -> Path:
    """Compile the kernel (if not cached) and return the shared library's path.

    ``arch`` is ``g++``'s ``-march``: ``native`` (what the decoders load) or another target,
    e.g. ``haswell`` to build and test the AVX2 code path on an AVX-512 machine.

    Raises:
      KernelBuildError: no C++ compiler (``$CXX``, ``g++``, ``c++``), not x86-64 Linux, or the
        compiler failed (its output is in the message).
    """
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise KernelBuildError(
            f"the panel kernel is built for x86-64 Linux only, not "
            f"{platform.system()} {platform.machine()}"
        )
    out = library_path(arch)
    if out.exists() and not force:
        return out
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise KernelBuildError("no C++ compiler found (set $CXX, or install g++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *_flags(arch), "-I", jax.ffi.include_dir(), *map(str, _SOURCES), "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise KernelBuildError(
            f"compiling {' and '.join(f.name for f in _SOURCES)} failed ({' '.join(cmd)}):\n"
            f"{proc.stderr[-2000:]}"
        )
    os.replace(tmp, out)  # atomic: concurrent builders leave one whole file
    return out


def _load() -> bool:
    """Build, load and register the kernel once per process; False (logged) where it cannot."""
    if "ok" in _state:
        return _state["ok"]
    try:
        lib = ctypes.CDLL(str(build()))
        for target, symbol in _SYMBOLS.items():
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
            )
        _state["ok"] = True
    except (KernelBuildError, OSError) as e:
        log.info("panel kernel unavailable, XLA products are used: %s", e)
        _state["ok"] = False
        _state["error"] = str(e)
    return _state["ok"]


def panels_active(backend: Optional[str] = None) -> bool:
    """Whether per-layer input-major weights are laid out in panels and run by the kernel:
    the CPU backend, :data:`PANELS` True, or None with ``$JAXSPEC_PANELS`` ``1`` (or unset /
    ``auto`` on a CPU with AVX-512 or AVX2 + FMA, :func:`vector_isa`), and the kernel built and
    loaded (:func:`build`; True raises the build error instead of falling back).

    Raises:
      KernelBuildError: :data:`PANELS` is True and the kernel cannot be built.
    """
    if (backend or jax.default_backend()) != "cpu":
        return False
    want = PANELS
    if want is None:
        env = os.environ.get(ENV, "auto").strip().lower()
        if env in ("0", "false", "off", "no") or (env in ("auto", "") and vector_isa() is None):
            return False
        return _load()
    if not want:
        return False
    if not _load():
        raise KernelBuildError(_state.get("error", "the panel kernel did not load"))
    return True


def packable(w) -> bool:
    """Whether ``w`` can be packed: a float32 matrix ``(K, N)`` with ``N`` a multiple of 16."""
    return getattr(w, "ndim", 0) == 2 and w.dtype == jnp.float32 and w.shape[1] % PANEL == 0


def pack(w):
    """``W`` ``(K, N)`` -> panels ``(N / 16, K, 16)`` with ``wp[t, k, c] = W[k, 16 t + c]``
    (the same array type: numpy in, numpy out; JAX in, JAX out).

    Raises:
      ValueError: not a 2-D matrix whose column count is a multiple of 16.
    """
    if getattr(w, "ndim", 0) != 2 or w.shape[1] % PANEL:
        raise ValueError(
            f"pack needs a (K, N) matrix with N a multiple of {PANEL}, got shape "
            f"{tuple(getattr(w, 'shape', ()))}"
        )
    k, n = w.shape
    wp = w.reshape(k, n // PANEL, PANEL).transpose(1, 0, 2)
    return np.ascontiguousarray(wp) if isinstance(wp, np.ndarray) else jnp.array(wp)


def unpack(wp):
    """Panels ``(N / 16, K, 16)`` -> ``W`` ``(K, N)`` (the inverse of :func:`pack`)."""
    t, k, c = wp.shape
    return wp.transpose(1, 0, 2).reshape(k, t * c)


def pack_q4(w) -> Optional[np.ndarray]:
    """Q4_1 panels of a float32 matrix ``W`` ``(K, N)`` whose every block of 32 consecutive
    inputs of one output is exactly ``float32(d * q) + m`` with 4-bit codes ``q`` and float32
    ``d``, ``m`` (``d * q`` exact), or None where it is not.

    Three GGUF block formats dequantize (``gguf.quants.dequantize``, as
    :func:`models.llama.params.load_gguf` does) to such matrices:

    * **Q4_1** stores float16 ``d`` and ``m`` per block. :func:`_fit_q4_1` takes ``m`` = the
      block's minimum and ``d`` among the float16 values next to ``(max - m) / 15``.
    * **Q4_K** (256-input super-blocks of eight 32-input sub-blocks) stores per sub-block
      ``d = d_s * sc`` and ``m = -dmin_s * mn`` (float16 super-block scales, 6-bit ``sc``,
      ``mn``): both exact in float32, and ``d * q - dmin_s * mn`` is rounded once.
      :func:`_fit_affine` finds them from the values (``d`` = the block's span over 15 or
      fewer code steps, the codes counted from the block's minimum).
    * **Q4_0** (``d * (q - 8)``, float16 ``d``): the same search, ``m`` = the minimum.

    A fit is kept only if ``d * q + m`` rebuilds every weight of the block **bit for bit**; one
    block that does not gives None (the caller keeps the float32 panels). So the kernel
    multiplies exactly the float32 matrix, from 0.75 bytes a weight: ``uint8`` ``(N / 16, K /
    32, 384)``, per panel ``t`` and block ``b`` the 16 columns' ``d`` and ``m`` as float32,
    then 16 pairs of rows as 16 bytes (row ``2 i`` in the low nibble, ``2 i + 1`` in the high
    one).

    Args:
      w: float32 ``(K, N)`` (numpy or JAX, host-readable), ``K`` a multiple of 32 and ``N``
        of 16; anything else gives None.
    """
    v = _blocks(w)
    if v is None:
        return None
    fit = _fit_q4_1(v)
    fit = _fit_affine(v) if fit is None else fit
    if fit is None:
        return None
    best_q, best_d, m = fit
    b, t = v.shape[0], v.shape[2] // PANEL
    q = best_q.reshape(b, Q4_BLOCK // 2, 2, t, PANEL).astype(np.uint8)
    codes = (q[:, :, 0] | (q[:, :, 1] << 4)).transpose(2, 0, 1, 3).reshape(t, b, -1)
    parts = [_scale_bytes(best_d), _scale_bytes(m), codes]
    return np.ascontiguousarray(np.concatenate(parts, axis=-1))


def _fit_q4_1(v: np.ndarray):
    """GGUF Q4_1 blocks: ``(q, d, m)`` per block of ``v`` ``(B, 32, N)`` with float16 ``m`` =
    the block's minimum and float16 ``d`` (:func:`_fit_blocks`), as float32 ``(B, 32, N)``,
    ``(B, 1, N)``, ``(B, 1, N)``; None when a block has none."""
    m = v.min(axis=1, keepdims=True)
    if not np.array_equal(
        m.astype(np.float16).astype(np.float32).view(np.uint32), m.view(np.uint32)
    ):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        fit = _fit_blocks(v, (v.max(axis=1, keepdims=True) - m) / np.float32(15), m, 0, 15)
    return None if fit is None else (fit[0], fit[1], m)


#: blocks :func:`_fit_affine` and :func:`_fit_scale` try first: a matrix some of whose first
#: blocks do not fit is turned down before the whole matrix is searched
_SAMPLE_BLOCKS = 512
#: blocks fitted at a time (about 1 MB of temporaries per step)
_CHUNK_BLOCKS = 1 << 13
#: the code ranges :func:`_fit_scale` tries, commonest first: a block's largest ``|w|`` is
#: ``d * k``; Q8_0 127, Q5_0 16, Q4_0 8, Q6_K mostly 32 or 31 (its scale search), then the rest
#: (128: a block whose largest weight has the code -128)
_SCALE_STEPS = (127, 16, 8, 32, 31)
_SCALE_STEPS += tuple(k for k in range(128, 0, -1) if k not in _SCALE_STEPS)
#: the same for blocks of 16 (Q6_K sub-blocks) first
_SCALE_STEPS_16 = (32, 31) + tuple(k for k in _SCALE_STEPS if k not in (32, 31))


def _block_rows(v: np.ndarray) -> np.ndarray:
    """Blocks ``(B, n, N)`` -> one row per block and column ``(B * N, n)``."""
    return np.ascontiguousarray(v.transpose(0, 2, 1)).reshape(-1, v.shape[1])


def _fit_rows(v: np.ndarray, codes_of):
    """Run ``codes_of`` (rows ``(R, n)`` -> per-row fit arrays or None) on a sample of the
    blocks of ``v`` ``(B, n, N)``, then, if every sampled block fits, on all of them; returns
    the fit arrays back in block layout (``(B, n, N)`` codes, ``(B, 1, N)`` per-block values)."""
    rows = _block_rows(v)
    if codes_of(rows[:_SAMPLE_BLOCKS]) is None:
        return None
    parts = []
    for start in range(0, rows.shape[0], _CHUNK_BLOCKS):  # bounded temporaries (a 233M head)
        part = codes_of(rows[start : start + _CHUNK_BLOCKS])
        if part is None:
            return None
        parts.append(part)
    fit = tuple(np.concatenate(arrays) for arrays in zip(*parts))
    b, n, cols = v.shape
    return tuple(a.reshape(b, cols, a.shape[-1]).transpose(0, 2, 1) for a in fit)


def _fit_affine(v: np.ndarray):
    """``(q, d, m)`` per block of ``v`` ``(B, 32, N)`` with ``v = float32(d * q) + m``, codes
    ``q`` in ``[0, 15]``, float32 ``d`` with ``d * q`` exact and ``m`` = the block's minimum
    (GGUF Q4_K sub-blocks: :func:`pack_q4`); None when a block has none. ``d * q`` is exact
    for every 4-bit ``q`` where ``d``'s low 4 significand bits are 0 (at most 20 significant
    bits; a Q4_K ``d = d_s * sc`` has at most 17), so only such ``d`` are taken: the kernel's
    ``fma(q, d, m)`` and a build without FMA then both give ``float32(d * q) + m``."""

    def codes_of(x):
        lo = x.min(axis=1, keepdims=True)
        span = x.max(axis=1, keepdims=True) - lo
        centred = x - lo  # the codes times d, rounded as the weights were
        q, d = np.zeros(x.shape, np.float32), np.zeros(lo.shape, np.float32)
        todo = np.arange(x.shape[0])
        for steps in range(15, 0, -1):
            every = todo.size == x.shape[0]  # the first pass reads the arrays in place
            xs, cen = (x, centred) if every else (x[todo], centred[todo])
            low, s = (lo, span) if every else (lo[todo], span[todo])
            s = s / np.float32(steps)
            with np.errstate(divide="ignore", invalid="ignore"):
                c = np.clip(np.rint(cen / np.where(s > 0, s, 1)), 0, 15).astype(np.float32)
            short = (s.view(np.uint32) & 0xF) == 0  # d * q exact for every 4-bit q
            ok = (short & _same_weights(s * c + low, xs)).all(axis=1)
            q[todo[ok]], d[todo[ok]] = c[ok], s[ok]
            todo = todo[~ok]
            if todo.size == 0:
                return q, d, lo
        return None

    return _fit_rows(v, codes_of)


def _same_weights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: float32 ``a`` and ``b`` are the same weight bit for bit, but for the sign
    of a zero. A packed block rebuilds ``-0.0`` (e.g. ``d * 0`` of a GGUF Q5_0 / Q6_K block
    with ``d < 0``) as ``+0.0``, which no product sees: every output element is a chain of
    fused multiply-adds from ``+0``, and ``acc + (+-0)`` is ``acc`` for ``acc != 0`` and ``+0``
    for ``acc = +0``, so the chain never holds ``-0`` and its bits do not change."""
    zero = np.float32(0)
    return (a + zero).view(np.uint32) == (b + zero).view(np.uint32)


def _fit_scale(v: np.ndarray):
    """``(q, d)`` per block of ``v`` ``(B, n, N)`` with ``v = float32(d * q)``, int8 codes and
    float32 ``d`` = the block's largest ``|w|`` over one of :data:`_SCALE_STEPS` (GGUF Q8_0,
    Q5_0 and Q4_0 blocks of 32, Q6_K sub-blocks of 16: :func:`pack_q8`); None when a block
    has none."""

    def codes_of(x):
        amax = np.abs(x).max(axis=1, keepdims=True)
        q, d = np.zeros(x.shape, np.float32), np.zeros(amax.shape, np.float32)
        todo = np.arange(x.shape[0])
        for steps in _SCALE_STEPS if x.shape[1] == Q4_BLOCK else _SCALE_STEPS_16:
            xs, s = x[todo], amax[todo] / np.float32(steps)
            with np.errstate(divide="ignore", invalid="ignore"):
                c = np.where(s > 0, np.rint(xs / np.where(s > 0, s, 1)), 0)
            c = c.astype(np.float32) + np.float32(0)  # the int8 code: no -0
            ok = ((c >= -128) & (c <= 127) & _same_weights(s * c, xs)).all(axis=1)
            q[todo[ok]], d[todo[ok]] = c[ok], s[ok]
            todo = todo[~ok]
            if todo.size == 0:
                return q, d
        return None

    return _fit_rows(v, codes_of)


def pack_exact(w):
    """The most compact panels that hold ``w`` ``(K, N)`` exactly: Q4_1 panels
    (:func:`pack_q4`) where ``w`` is a concrete dequantized GGUF Q4_1 or Q4_K tensor (every
    projection of the SmolLM2-135M file, most of Qwen2.5-Coder-1.5B's), else Q8 panels with a
    scale per 32 inputs (:func:`pack_q8`: Q8_0, Q5_0, Q4_0; e.g. SmolLM2's tied LM head, most
    of Qwen2.5-Coder-0.5B's projections), else per 16 inputs (``pack_q8(w, 16)``: Q6_K), else
    float32 panels (:func:`pack`; always where :data:`Q4` is False). Each gives the same
    products bit for bit (:func:`panel_product`).
    numpy in, numpy out; JAX in, JAX out (traced arrays get float32 panels).

    Raises:
      ValueError: as :func:`pack`.
    """
    if Q4 and not isinstance(w, jax.core.Tracer):
        wq = pack_q4(w)
        wq = pack_q8(w) if wq is None else wq
        wq = pack_q8(w, Q8_16_BLOCK) if wq is None else wq
        if wq is not None:
            return wq if isinstance(w, np.ndarray) else jnp.asarray(wq)
    return pack(w)


def is_q4(wp) -> bool:
    """Whether panels ``wp`` are Q4_1 panels (:func:`pack_q4`, uint8)."""
    return wp.dtype == np.uint8


def is_q8(wp) -> bool:
    """Whether panels ``wp`` are Q8 panels (:func:`pack_q8`, int8; either block size)."""
    return wp.dtype == np.int8


def q8_block(wq) -> int:
    """Inputs per scale block of Q8 panels ``wq`` (:func:`pack_q8`): 32 or 16."""
    return (wq.shape[-1] - 4 * PANEL) // PANEL


def as_float_panels(wp):
    """float32 panels ``(N / 16, K, 16)`` of the matrix that panels ``wp`` of any kind hold."""
    if is_q4(wp):
        return pack(unpack_q4(wp))
    return pack(unpack_q8(wp)) if is_q8(wp) else wp


def pack_q8(w, block: int = Q4_BLOCK) -> Optional[np.ndarray]:
    """Q8 panels of a float32 matrix ``W`` ``(K, N)`` whose every block of ``block``
    consecutive inputs of one output is exactly ``float32(d * q)`` with int8 codes ``q`` and a
    float32 ``d``, or None where it is not.

    * ``block`` 32: GGUF **Q8_0** (float16 ``d``, int8 ``q``; the block's largest ``|w|`` is
      ``127 d``), **Q5_0** and **Q4_0** (float16 ``d``, ``q - 16`` or ``q - 8``); all found
      by :func:`_fit_scale`.
    * ``block`` 16: GGUF **Q6_K** sub-blocks (``d = d_s * sc``, float16 ``d_s``, int8 ``sc``,
      6-bit codes ``q - 32``: ``d * q`` exact in float32).

    A fit is kept only if it rebuilds every weight bit for bit. Layout: ``int8`` ``(N / 16, K
    / block, 64 + 16 block)``, per panel ``t`` and block ``b`` the 16 columns' ``d`` as
    float32 bytes, then ``block`` rows of 16 codes (1.125 / 1.25 bytes a weight).

    Args:
      w: float32 ``(K, N)``, ``K`` a multiple of ``block`` and ``N`` of 16; anything else
        gives None.
      block: 32 or 16.

    Raises:
      ValueError: another ``block``.
    """
    if block not in (Q4_BLOCK, Q8_16_BLOCK):
        raise ValueError(f"pack_q8: block must be {Q4_BLOCK} or {Q8_16_BLOCK}, got {block}")
    v = _blocks(w, block)
    if v is None:
        return None
    fit = _fit_scale(v)
    if fit is None:
        return None
    best_q, best_d = fit
    b, t = v.shape[0], v.shape[2] // PANEL
    codes = best_q.astype(np.int8).reshape(b, block, t, PANEL).transpose(2, 0, 1, 3)
    parts = [_scale_bytes(best_d).view(np.int8), codes.reshape(t, b, -1)]
    return np.ascontiguousarray(np.concatenate(parts, axis=-1))


def unpack_q8(wq):
    """Q8 panels ``(N / 16, K / block, 64 + 16 block)`` (:func:`pack_q8`) -> float32 ``W``
    ``(K, N)``, bit for bit (numpy in, numpy out; JAX in, JAX out)."""
    t, b, _ = wq.shape
    block = q8_block(wq)
    d, xp = _read_scales(wq, 0), (np if isinstance(wq, np.ndarray) else jnp)
    q = wq[..., 4 * PANEL :].reshape(t, b, block, PANEL).astype(xp.float32)
    w = q * d[:, :, None, :]
    return w.transpose(1, 2, 0, 3).reshape(b * block, t * PANEL)


def _blocks(w, block: int = Q4_BLOCK) -> Optional[np.ndarray]:
    """A float32 ``(K, N)`` matrix as blocks ``(K / block, block, N)`` of consecutive inputs
    (GGUF's quant blocks), or None when it is not one, or ``K`` is not a multiple of ``block``
    or ``N`` of 16."""
    if getattr(w, "ndim", 0) != 2 or w.dtype != np.float32:
        return None
    k, n = w.shape
    if k % block or n % PANEL or k == 0 or n == 0:
        return None
    return np.asarray(w).reshape(k // block, block, n)


def _scale_bytes(a: np.ndarray) -> np.ndarray:
    """Per-block float32 scales ``(B, 1, N)`` -> their bytes per panel ``(N / 16, B, 64)``."""
    b, _, n = a.shape
    return a.reshape(b, n // PANEL, PANEL).transpose(1, 0, 2).copy().view(np.uint8)


def _read_scales(wq, start: int):
    """The float32 scales stored at byte ``start`` of every panel block: ``(T, B, 16)``."""
    raw = wq[..., start : start + 4 * PANEL]
    if isinstance(wq, np.ndarray):
        return raw.copy().view(np.float32)
    t, b, _ = wq.shape
    return jax.lax.bitcast_convert_type(raw.reshape(t, b, PANEL, 4), jnp.float32)


def _fit_blocks(v: np.ndarray, scale: np.ndarray, offset, lo: int, hi: int):
    """Per block of ``v`` ``(B, 32, N)``: integer codes ``q`` in ``[lo, hi]`` and a float16
    ``d`` among the three float16 values nearest ``scale`` ``(B, 1, N)`` with ``d * q (+
    offset)`` equal to the block bit for bit, as float32 ``(q (B, 32, N), d (B, 1, N))``;
    None when a block has none."""
    d0 = scale.astype(np.float16)
    best_q = np.zeros(v.shape, np.float32)
    best_d = np.zeros(d0.shape, np.float32)
    done = np.zeros(d0.shape, bool)
    for step in (0, 1, -1):
        d = _f16_neighbour(d0, step).astype(np.float32)
        centred = v if offset is None else v - offset
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(d > 0, np.rint(centred / np.where(d > 0, d, 1)), 0)
        q = np.clip(q, lo, hi).astype(np.float32)
        rebuilt = d * q if offset is None else d * q + offset
        ok = (rebuilt.view(np.uint32) == v.view(np.uint32)).all(axis=1, keepdims=True)
        new = ok & ~done
        best_q = np.where(new, q, best_q)
        best_d = np.where(new, d, best_d)
        done |= ok
        if done.all():
            return best_q, best_d
    return None


def _f16_neighbour(h: np.ndarray, step: int) -> np.ndarray:
    """The float16 values ``step`` ulps above (``step`` > 0) or below ``h`` (>= 0 values)."""
    if step == 0:
        return h
    bits = h.view(np.uint16).astype(np.int32) + step
    return np.clip(bits, 0, 0x7BFF).astype(np.uint16).view(np.float16)


def unpack_q4(wq):
    """Q4_1 panels ``(N / 16, K / 32, 384)`` (:func:`pack_q4`) -> float32 ``W`` ``(K, N)``,
    the matrix they hold bit for bit (numpy in, numpy out; JAX in, JAX out)."""
    t, b, _ = wq.shape
    xp = np if isinstance(wq, np.ndarray) else jnp
    d, m = _read_scales(wq, 0), _read_scales(wq, 4 * PANEL)  # (t, b, 16)
    codes = wq[..., 8 * PANEL :].reshape(t, b, Q4_BLOCK // 2, PANEL)
    q = xp.stack([codes & 15, codes >> 4], axis=3).astype(xp.float32)  # (t, b, 16, 2, 16)
    w = d[:, :, None, None, :] * q + m[:, :, None, None, :]
    return w.transpose(1, 2, 3, 0, 4).reshape(b * Q4_BLOCK, t * PANEL)


def panel_product(x: jax.Array, wp: jax.Array) -> jax.Array:
    """``x (..., K) @ W`` for ``W`` packed by :func:`pack` -> ``(..., N)``, ``x``'s dtype.

    float32 on the CPU with the kernel loaded: the kernel (one FFI call; rows of any count,
    up to 16 at a time per panel). Otherwise an ``einsum`` over the panels (same sums,
    XLA's order).

    Raises:
      ValueError: ``x``'s last axis is not the panels' ``K``.
    """
    if is_q4(wp) or is_q8(wp):
        return _quant_product(x, wp)
    t, k, c = wp.shape
    if x.shape[-1] != k:
        raise ValueError(f"panel_product: x has {x.shape[-1]} features, the panels {k}")
    lead = x.shape[:-1]
    if (
        x.dtype != jnp.float32
        or wp.dtype != jnp.float32
        or jax.default_backend() != "cpu"
        or not _load()
    ):
        return jnp.einsum("...k,tkc->...tc", x, wp.astype(x.dtype)).reshape(lead + (t * c,))
    rows = int(np.prod(lead)) if lead else 1
    out = jax.ShapeDtypeStruct((rows, t * c), jnp.float32)
    call = jax.ffi.ffi_call(_TARGET, out, vmap_method="sequential")
    return call(x.reshape(rows, k), wp).reshape(lead + (t * c,))


def _quant_product(x: jax.Array, wq: jax.Array) -> jax.Array:
    """``x (..., K) @ W`` for Q4_1 or Q8 panels (:func:`pack_q4`, :func:`pack_q8`): the
    kernel where it is loaded (float32 ``x``), else an XLA product with the rebuilt matrix."""
    t, b, _ = wq.shape
    k, n = b * Q4_BLOCK, t * PANEL
    if is_q4(wq):
        kind, target, unpacked = "Q4_1", _TARGET_Q4, unpack_q4
    else:
        k = b * q8_block(wq)
        kind = "Q8_0" if q8_block(wq) == Q4_BLOCK else f"Q8 ({q8_block(wq)}-input block)"
        unpacked = unpack_q8
        target = _TARGET_Q8 if q8_block(wq) == Q4_BLOCK else _TARGET_Q8_16
    if x.shape[-1] != k:
        raise ValueError(f"panel_product: x has {x.shape[-1]} features, the {kind} panels {k}")
    lead = x.shape[:-1]
    if x.dtype != jnp.float32 or jax.default_backend() != "cpu" or not _load():
        return (x @ unpacked(wq).astype(x.dtype)).reshape(lead + (n,))
    rows = int(np.prod(lead)) if lead else 1
    out = jax.ShapeDtypeStruct((rows, n), jnp.float32)
    call = jax.ffi.ffi_call(target, out, vmap_method="sequential")
    return call(x.reshape(rows, k), wq).reshape(lead + (n,))


__all__ = [
    "ENV",
    "KernelBuildError",
    "PANEL",
    "PANELS",
    "Q4",
    "SUFFIX",
    "build",
    "library_path",
    "Q4_BLOCK",
    "Q4_BYTES",
    "Q8_BYTES",
    "Q8_16_BLOCK",
    "Q8_16_BYTES",
    "as_float_panels",
    "is_q4",
    "is_q8",
    "pack",
    "pack_exact",
    "pack_q4",
    "pack_q8",
    "q8_block",
    "packable",
    "panel_product",
    "panels_active",
    "unpack",
    "unpack_q4",
    "unpack_q8",
]
