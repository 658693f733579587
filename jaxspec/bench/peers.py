"""Peer systems on the same device, weights, prompts and budgets as jaxspec (the ``peers``
suite of :mod:`jaxspec.bench.device`).

Rows (greedy, batch 1, every system on every prompt in rotating order, after one untimed
warm-up each: the protocol of :func:`jaxspec.bench.ar_suite.run_ar_suite`):

* ``jaxspec/ar`` (baseline and token reference), ``jaxspec/ngram`` (draft length
  :data:`NGRAM_K`), ``jaxspec/sps`` (draft length :data:`SPS_K`, the draft model below);
* ``transformers/ar-static-compile``: ``generate`` with a static KV cache
  (``cache_implementation="static"``) and ``model.forward`` compiled by ``torch.compile``
  (``mode="reduce-overhead", fullgraph=True``), the fast path of transformers' documentation
  (``ar-static`` without the compile, e.g. on a CPU without a C compiler);
* ``transformers/prompt-lookup`` (``prompt_lookup_num_tokens`` = :data:`NGRAM_K`);
* ``transformers/assisted``: assisted generation with the same draft model and exactly
  :data:`SPS_K` drafts per step (:class:`jaxspec.bench.systems.TransformersSystem`).

Every row says whether its tokens equal ``jaxspec/ar``'s (``identical``) and on what share of
the prompts. The draft model of both SPS rows is the target's first layers with its final norm
and head (:func:`truncated_draft` and :func:`truncated_hf`): the vehicles
ship no smaller model of the same vocabulary.

The official Fast-dLLM decoding code is never committed: :func:`load_fastdllm` imports it,
unmodified, from an ignored folder (``$JAXSPEC_FASTDLLM`` or :data:`FASTDLLM_DEFAULT`) that a
device call carries (the pack's optional ``fastdllm`` artifact); without it its rows say so.
Its Dream rows (:func:`fastdllm_dream_rows`): the dllm vehicle exported to the Hugging Face
Dream layout (:func:`models.diffusion.hf_export.export_dream_hf`), loaded by the official
modeling code and decoded by its dual-cache threshold block decoder, beside jaxspec's
``threshold`` method with the same block rule (``block_start="first-position"``,
``cache="dual"``), which is that row's token reference. Its LLaDA rows
(:func:`fastdllm_llada_rows`): a LLaDA-head model (:func:`llada_vehicle`: the dllm vehicle,
read with the LLaDA head when it is a Dream) exported to the LLaDA layout
(:func:`models.diffusion.hf_export.export_llada_hf`), loaded by the official modeling code and
decoded by each of its decoders in ``llada/generate.py``, beside its jaxspec counterpart, the
token reference of that pair (:func:`llada_decode_config`):

* ``generate`` (no cache), ``generate_with_prefix_cache``, ``generate_with_dual_cache`` ->
  ``cache="none"``, ``"prefix"``, ``"dual"``;
* ``threshold=None`` (``steps`` positions per block spread by ``get_num_transfer_tokens``) ->
  the ``stepwise`` method with the same ``steps``; ``threshold=t`` -> the ``threshold`` method
  with ``t``;
* ``remasking="low_confidence"`` and temperature 0 -> jaxspec's defaults (``block_start=
  "rule"``: every step, a block's opening full forward included, applies the rule;
  ``confidence_softmax="official"``: the softmax keeps the [MASK] logit).

The decisions agree (tests/bench/test_hf_export.py); the one difference is a count: with a
cache the official loop forwards once more after a block whose opening full forward unmasked
it all (that forward transfers nothing), so its NFE exceeds jaxspec's by the number of such
blocks. The official code could also predict [MASK] and "transfer" it; jaxspec never does
(:class:`jaxspec.dllm.config.DiffusionDecodeConfig`).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

NGRAM_K = 8
SPS_K = 5
FASTDLLM_ENV = "JAXSPEC_FASTDLLM"
FASTDLLM_DEFAULT = "third_party/Fast-dLLM"
# the module files of the official code this hook imports, per model family
FASTDLLM_MODULES = {"llada": "llada/generate.py", "dream": "dream/model/generation_utils_block.py"}


# the checkout's files a device pack carries (:func:`pack_fastdllm`): the decoders, the
# modeling code they run, and the licence
FASTDLLM_ARTIFACT = "fastdllm"
FASTDLLM_PACK_FILES = ("LICENSE", "dream/model/*.py", "llada/generate.py", "llada/model/*.py")


class PeerUnavailable(RuntimeError):
    """A peer that cannot run here (package or code missing); the message is its row's
    reason."""


def fastdllm_root(path: Optional[str] = None) -> Path:
    """Where the official Fast-dLLM checkout is looked for: ``path``, else
    ``$JAXSPEC_FASTDLLM``, else :data:`FASTDLLM_DEFAULT` (ignored by git)."""
    return Path(path or os.environ.get(FASTDLLM_ENV) or FASTDLLM_DEFAULT)


def load_fastdllm(family: str, root: Optional[str] = None):
    """Import the official Fast-dLLM decoding module of ``family`` (``"llada"`` or
    ``"dream"``) from the checkout at :func:`fastdllm_root`, unmodified.

    Raises:
      PeerUnavailable: an unknown family, no checkout there, or an import error (one line).
    """
    if family not in FASTDLLM_MODULES:
        raise PeerUnavailable(
            f"unknown Fast-dLLM family {family!r}; expected {', '.join(FASTDLLM_MODULES)}"
        )
    base = fastdllm_root(root)
    path = base / FASTDLLM_MODULES[family]
    if not path.is_file():
        raise PeerUnavailable(
            f"official Fast-dLLM code not found at {path} (put a checkout "
            f"at {FASTDLLM_DEFAULT} or set {FASTDLLM_ENV})"
        )
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"fastdllm_{family}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - third-party import failure is a row's reason
        raise PeerUnavailable(
            f"Fast-dLLM {family} import failed: {' '.join(str(e).split())[:200]}"
        ) from None
    finally:
        sys.path.remove(str(path.parent))
    return mod


def pack_fastdllm(dest: Path, root: Optional[str] = None) -> Optional[Path]:
    """A gzipped tar at ``dest`` of the checkout's :data:`FASTDLLM_PACK_FILES` (paths relative
    to the checkout), for a device pack; None when there is no checkout at
    :func:`fastdllm_root`."""
    import tarfile

    base = fastdllm_root(root)
    files = sorted({f for pat in FASTDLLM_PACK_FILES for f in base.glob(pat) if f.is_file()})
    if not (base / FASTDLLM_MODULES["dream"]).is_file() or not files:
        return None
    dest = Path(dest)
    with tarfile.open(dest, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(base)))
    return dest


def unpack_fastdllm(tar_path: Path, dest: Path) -> Path:
    """Extract a :func:`pack_fastdllm` tar into ``dest`` and point ``$JAXSPEC_FASTDLLM`` at
    it unless a checkout is already found (:func:`fastdllm_root`). Returns ``dest``.

    Raises:
      PeerUnavailable: a member outside ``dest`` or not a plain file."""
    import tarfile

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, "r:gz") as tar:
        for m in tar.getmembers():
            target = (dest / m.name).resolve()
            if not m.isfile() or dest.resolve() not in target.parents:
                raise PeerUnavailable(f"Fast-dLLM pack member {m.name!r} is not a file in it")
            with tar.extractfile(m) as src:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(src.read())
    if not (fastdllm_root() / FASTDLLM_MODULES["dream"]).is_file():
        os.environ[FASTDLLM_ENV] = str(dest)
    return dest


def _default_rope_init(config, device=None, seq_len=None, **_):
    """Plain RoPE inverse frequencies ``theta ** (-2i / d)``, ``i < d / 2``, with ``d =
    hidden_size // num_attention_heads`` and attention factor 1: what transformers 4.x
    registered as ``ROPE_INIT_FUNCTIONS["default"]`` (4.49 for Fast-dLLM), which the official
    Dream code looks up and transformers 5 no longer registers."""
    import torch

    d = config.hidden_size // config.num_attention_heads
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = config.rope_parameters["rope_theta"]
    exps = torch.arange(0, d, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / d
    return 1.0 / (float(theta) ** exps), 1.0


def _register_default_rope() -> None:
    """Give transformers the ``"default"`` RoPE initialiser the official Dream code needs
    (:func:`_default_rope_init`) when this transformers lacks it; the official code itself
    stays unmodified."""
    from transformers import modeling_rope_utils

    modeling_rope_utils.ROPE_INIT_FUNCTIONS.setdefault("default", _default_rope_init)


def _accept_validate_keywords(cls) -> None:
    """Let ``cls.validate`` (the official ``DreamGenerationConfig.validate``, whose body is
    ``pass``) take the keywords transformers 5's ``GenerationConfig.update`` passes it
    (``user_set_attributes``); it still does nothing. Done once per class."""
    import inspect

    if getattr(cls.validate, "_jaxspec_compat", False):
        return
    params = inspect.signature(cls.validate).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    original = cls.validate

    def validate(self, *args, **kwargs):
        return original(self, *args, **{k: v for k, v in kwargs.items() if k in params})

    validate._jaxspec_compat = True
    cls.validate = validate


def load_fastdllm_dream(root: Optional[str] = None):
    """The official Fast-dLLM Dream code from the checkout at :func:`fastdllm_root`, unmodified:
    its ``dream/model`` package (``modeling_dream``, ``configuration_dream``) imported under
    the name ``fastdllm_dream_model``, and its block decoder module
    (``dream/model/generation_utils_block.py``, :func:`load_fastdllm`). Returns ``(DreamModel
    class, block decoder module)``.

    Raises:
      PeerUnavailable: no checkout, torch / transformers missing, or an import error."""
    why = transformers_available()
    if why:
        raise PeerUnavailable(why)
    block = load_fastdllm("dream", root)
    pkg_dir = fastdllm_root(root) / "dream" / "model"
    name = "fastdllm_dream_model"
    try:
        _register_default_rope()
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                name, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
            )
            pkg = importlib.util.module_from_spec(spec)
            sys.modules[name] = pkg
            try:
                spec.loader.exec_module(pkg)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        modeling = importlib.import_module(f"{name}.modeling_dream")
        for mod in (importlib.import_module(f"{name}.generation_utils"), block):
            _accept_validate_keywords(mod.DreamGenerationConfig)
    except Exception as e:  # noqa: BLE001 - third-party import failure is a row's reason
        raise PeerUnavailable(
            f"Fast-dLLM dream modeling import failed: {' '.join(str(e).split())[:200]}"
        ) from None
    return modeling.DreamModel, block


def load_dream_hf(folder, root: Optional[str] = None, dtype: str = "float32", device="cpu"):
    """``DreamModel.from_pretrained(folder)`` with the official code (:func:`
    load_fastdllm_dream`), in ``dtype`` on ``device``, in eval mode, with the block decoder's
    ``diffusion_generate`` / ``_sample`` bound to it as Fast-dLLM's ``dream/eval.py`` binds
    them, and its RoPE buffers recomputed (``reset_rope_parameters``). Raises
    :class:`PeerUnavailable` as :func:`load_fastdllm_dream`."""
    import types

    import torch

    DreamModel, block = load_fastdllm_dream(root)
    m = DreamModel.from_pretrained(str(folder), torch_dtype=getattr(torch, dtype))
    # transformers 5 builds the model on the meta device and leaves non-persistent buffers
    # (the RoPE inverse frequencies) unset: the official class's own reset recomputes them
    m.reset_rope_parameters()
    m = m.to(device).eval()
    m.diffusion_generate = types.MethodType(block.DreamGenerationMixin.diffusion_generate, m)
    m._sample = types.MethodType(block.DreamGenerationMixin._sample, m)
    return m


def _timed_decoder(m: str, cfg, v):
    """``prompt -> (tokens, target NFE, seconds, compile seconds)`` of jaxspec method ``m``
    with ``cfg`` on the vehicle ``v``: one untimed call first (compilation), then the timed
    one."""
    from jaxspec.methods import run

    kw = dict(eos_ids=tuple(v.eos_ids), pad_id=v.pad_id)

    def decode(prompt):
        first = run(m, v.model, v.params, [list(prompt)], cfg, **kw)
        t0 = time.perf_counter()
        res = run(m, v.model, v.params, [list(prompt)], cfg, **kw)
        wall = time.perf_counter() - t0 - (res.compile_s or 0.0)
        toks = [int(t) for t in res.tokens[0]]
        return toks, int(res.stats.target_nfe[0]), wall, float(first.compile_s or 0.0)

    return decode


def cut_at_eos(tokens: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """``tokens`` up to and including the first id of ``eos_ids`` (all of them when none is
    there): how jaxspec's masked-diffusion decoders return a row."""
    out = []
    for t in tokens:
        out.append(int(t))
        if int(t) in eos_ids:
            break
    return out


def _count_forwards(hf_model, limit: int, who: str):
    """A forward pre-hook on ``hf_model`` that counts its forwards into ``calls[0]`` and raises
    ``RuntimeError`` past ``limit`` (an official decoder that predicts [MASK] never finishes).
    Returns ``(calls, handle)``; the caller removes ``handle``."""
    calls = [0]

    def count(module, args):
        calls[0] += 1
        if calls[0] > limit:
            raise RuntimeError(
                f"{who} made no progress after {limit} forwards (it predicts [MASK])"
            )

    return calls, hf_model.register_forward_pre_hook(count)


def fastdllm_dream_generate(
    hf_model,
    prompt: Sequence[int],
    *,
    gen_length: int,
    block_length: int,
    threshold: float,
    mask_id: int,
) -> tuple[list[int], int]:
    """Greedy Fast-dLLM Dream decoding of one prompt with the official block decoder bound to
    ``hf_model`` (:func:`load_dream_hf`): ``diffusion_generate`` with
    ``alg="confidence_threshold"``, ``threshold``, ``block_length``, ``dual_cache=True``,
    ``max_new_tokens = steps = gen_length``, temperature 0 (Fast-dLLM's ``dream/eval.py``
    settings for its dual-cache threshold rows), starting from the checkpoint's own
    generation config (``generation_config.json``; deriving one from the model config fails
    under transformers 5).

    Returns ``(the gen_length generated ids, forward passes)``.

    Raises:
      RuntimeError: more forwards than ``gen_length + blocks`` (each one after a block's
        first commits at least one position unless the official code predicts [MASK] there,
        which would loop for ever)."""
    import torch

    limit = gen_length + gen_length // block_length + 1
    dev = next(hf_model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    calls, handle = _count_forwards(hf_model, limit, "Fast-dLLM Dream")
    try:
        out = hf_model.diffusion_generate(
            ids,
            generation_config=hf_model.generation_config,
            max_new_tokens=gen_length,
            steps=gen_length,
            alg="confidence_threshold",
            threshold=float(threshold),
            block_length=block_length,
            dual_cache=True,
            temperature=0.0,
            mask_token_id=int(mask_id),
            return_dict_in_generate=False,
        )
    finally:
        handle.remove()
    return [int(t) for t in out[0, len(prompt) :].tolist()], calls[0]


def transformers_available() -> Optional[str]:
    """None when torch and transformers import, else the reason they do not."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return f"torch / transformers not importable ({e})"
    return None


def truncated_draft(vehicle, layers: int):
    """An SPS draft model from ``vehicle`` (a :class:`jaxspec.bench.device.Vehicle`'s
    ``model`` / ``params``): its first ``layers`` layers, final norm and
    head (an early exit without training; the vehicles ship no smaller model of the same
    vocabulary). Returns ``(CausalLM, params)``.

    Raises:
      ValueError: ``layers`` outside 1..(target layers - 1) or a layout without stacked
        layers."""
    import dataclasses

    import jax

    from models.llama.modeling import CausalLM

    cfg = vehicle.model.config
    n = min(int(layers), cfg.num_layers - 1)
    if n < 1:
        raise ValueError(f"an SPS draft needs 1..{cfg.num_layers - 1} layers, got {layers}")
    stacked = vehicle.params.get("layers")
    if not isinstance(stacked, dict):
        raise ValueError("the SPS draft slices stacked layer weights; this vehicle's are not")
    params = dict(vehicle.params)
    params["layers"] = jax.tree_util.tree_map(lambda x: x[:n], stacked)
    return CausalLM(dataclasses.replace(cfg, num_layers=n)), params


def truncated_hf(hf_model, layers: int):
    """A copy of a transformers Llama / Qwen2 causal LM keeping its first ``layers`` decoder
    layers (final norm and head kept): the draft of ``transformers/assisted``, the same model
    as :func:`truncated_draft` builds for ``jaxspec/sps``."""
    import torch

    m = copy.deepcopy(hf_model)
    n = int(layers)
    m.model.layers = torch.nn.ModuleList(list(m.model.layers)[:n])
    m.config.num_hidden_layers = n
    if getattr(m.config, "layer_types", None):
        m.config.layer_types = list(m.config.layer_types)[:n]
    return m.eval()


def static_compiled_system(
    hf_model,
    *,
    compile: bool,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    compile_options: Optional[dict] = None,
):
    """``transformers/ar-static-compile`` (``ar-static`` when ``compile`` is False): greedy
    ``generate`` of a copy of ``hf_model`` with ``cache_implementation="static"`` and, with
    ``compile``, its one-token decode steps run by ``torch.compile(forward,
    mode="reduce-overhead", fullgraph=True)`` (``compile_options`` replaces these keyword
    arguments, e.g. ``{"backend": "eager"}`` in a CPU test). A copy, so the other peers keep
    the eager model.

    How the compiled forward is called (:func:`_step_forward`), as transformers' own
    generate-time compilation does: the prompt pass runs eagerly, so the static cache
    allocates its key / value tensors outside the compiled graph and marks them as static
    addresses (allocated inside a CUDA-graph run they are graph outputs that the next replay
    overwrites: "accessing tensor output of CUDAGraphs that has been overwritten by a
    subsequent run"); each decode step begins with ``torch.compiler.
    cudagraph_mark_step_begin()`` and its logits are cloned before the next step replays the
    graph. The static cache is sized by each call's prompt + budget, so
    :func:`run_peers_suite` decodes every prompt once untimed first."""
    from jaxspec.bench.systems import TransformersSystem

    m = copy.deepcopy(hf_model)
    s = TransformersSystem("ar", m, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id)
    s.gen_config.cache_implementation = "static"
    # only the compile below: generate's own automatic compile of static-cache decoding
    # stays off, so "ar-static" is eager and "ar-static-compile" is the documented recipe
    s.gen_config.disable_compile = True
    if compile:
        opts = dict(mode="reduce-overhead", fullgraph=True)
        if compile_options is not None:
            opts = dict(compile_options)
        m.forward = _step_forward(m.forward, opts)
    s.method = "ar-static-compile" if compile else "ar-static"
    return s


def _step_forward(forward, compile_options: dict):
    """``forward`` with its one-token calls (decode steps) compiled by ``torch.compile(forward,
    **compile_options)`` and its other calls (the prompt pass) eager; each compiled call
    begins a new CUDA-graph step and returns cloned logits. The returned function counts
    its calls in ``.calls`` (``{"eager": n, "compiled": n}``)."""
    import torch

    compiled = torch.compile(forward, **compile_options)
    calls = {"eager": 0, "compiled": 0}

    def step(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.ndim != 2 or ids.shape[1] != 1:
            calls["eager"] += 1
            return forward(*args, **kwargs)
        calls["compiled"] += 1
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        logits = getattr(out, "logits", None)
        if logits is not None:
            out.logits = logits.clone()
        return out

    step.calls = calls
    return step


class PeerFailed(RuntimeError):
    """A peer raised while the suite ran it; ``name`` is the system, the message its one-line
    error."""

    def __init__(self, name: str, error: str):
        super().__init__(error)
        self.name = name


def one_line(e: BaseException, limit: int = 200) -> str:
    """``"<Type>: <message>"`` on one line, at most ``limit`` characters of message (a CUDA
    graph error's stack trace cut off)."""
    msg = " ".join(str(e).split(" Stack trace:")[0].split())
    return f"{type(e).__name__}: {msg[:limit]}"


class Guarded:
    """A system (``system``, ``method``, ``name``, ``run``) whose ``run`` turns any exception
    into :class:`PeerFailed`, naming the system, so the suite can drop it and go on."""

    def __init__(self, inner):
        self.inner = inner
        self.system, self.method = inner.system, inner.method

    @property
    def name(self) -> str:
        return self.inner.name

    def run(self, ids, max_new_tokens=None):
        try:
            if max_new_tokens is None:
                return self.inner.run(ids)
            return self.inner.run(ids, max_new_tokens=max_new_tokens)
        except PeerFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a peer's failure is its row, not the run's end
            raise PeerFailed(self.name, one_line(e)) from None


def failed_row(system, error: str) -> dict:
    """The row of a peer that failed: its name, ``failed`` and its one-line error."""
    return {
        "system": system.system,
        "method": system.method,
        "failed": True,
        "skipped": f"error: {error}",
    }


def run_contained(
    systems: Sequence,
    run: Callable[[list], dict],
    *,
    baseline: str = "jaxspec/ar",
    log: Callable[[str], None] = print,
) -> tuple[Optional[dict], list[dict]]:
    """``run(systems)`` with every system :class:`Guarded`: a system that raises is dropped
    (its row: :func:`failed_row`) and ``run`` starts again with the others, until it ends or
    the baseline itself fails. Returns ``(run's result or None, failed rows)``."""
    active = [s if isinstance(s, Guarded) else Guarded(s) for s in systems]
    failed: list[dict] = []
    while active:
        try:
            return run(active), failed
        except PeerFailed as e:
            bad = next(s for s in active if s.name == e.name)
            failed.append(failed_row(bad, str(e)))
            log(f"[peers] {e.name} failed: {e}")
            active = [s for s in active if s.name != e.name]
            if e.name == baseline:
                break
    return None, failed


FASTDLLM_THRESHOLD = 0.9
DREAM_PEER = ("fast-dllm", "dream (official)")


def _jaxspec_dream_decoder(v, s, threshold: float):
    """``prompt -> (tokens cut at EOS, NFE, seconds, compile seconds)``: jaxspec's
    ``threshold`` method with Fast-dLLM's Dream block rule (``block_start="first-position"``,
    ``cache="dual"``) on the dllm vehicle ``v``, one untimed call first (compilation)."""
    from jaxspec.methods import get_method

    m = get_method("threshold", "dllm")
    cfg = m.configure(
        gen_length=s.gen_length,
        block_length=s.block_length,
        cache="dual",
        threshold=threshold,
        block_start="first-position",
    )
    return _timed_decoder(m, cfg, v)


def _official_dream_decoder(hf, v, s, threshold: float):
    """``prompt -> (tokens cut at EOS, NFE, seconds, 0)``: the official Fast-dLLM Dream block
    decoder on ``hf`` (:func:`fastdllm_dream_generate`), timed to the host copy of its
    output."""
    kw = dict(
        gen_length=s.gen_length,
        block_length=s.block_length,
        threshold=threshold,
        mask_id=v.model.config.mask_token_id,
    )

    def decode(prompt):
        t0 = time.perf_counter()
        toks, nfe = fastdllm_dream_generate(hf, prompt, **kw)
        return cut_at_eos(toks, v.eos_ids), nfe, time.perf_counter() - t0, 0.0

    return decode


def _dream_row(system: str, method: str, outs: list, s, ref: Optional[list] = None) -> dict:
    """One row from per-prompt ``(tokens, NFE, seconds, compile seconds)``; ``ref``: the
    reference's outputs for the ``identical`` fields. Throughput counts the ``gen_length``
    positions each prompt decodes (as the ``methods-dllm`` suite does)."""
    import statistics

    from jaxspec.bench.records import first_divergence

    n = len(outs)
    row = {
        "system": system,
        "method": method,
        "prompts": n,
        "new_tokens": n * s.gen_length,
        "median_tokens_per_s": statistics.median(s.gen_length / o[2] for o in outs),
        "nfe_per_token": sum(o[1] for o in outs) / (n * s.gen_length),
        "compile_s": sum(o[3] for o in outs) or None,
    }
    if ref is not None:
        div = [first_divergence(o[0], r[0]) for o, r in zip(outs, ref)]
        same = [d is None for d in div]
        row.update(
            identical_to_reference=all(same),
            identical_share=sum(same) / n,
            first_divergence=(
                None if all(same) else statistics.median(d for d in div if d is not None)
            ),
        )
    return row


def _load_official_dream(v, work: Path):
    """The dllm vehicle exported to ``work`` (:func:`models.diffusion.hf_export.
    export_dream_hf`) and loaded by the official code (:func:`load_dream_hf`) in the
    vehicle's dtype on the transformers peers' device. Returns ``(model, dtype, device)``."""
    from jaxspec.bench.systems import torch_device
    from models.diffusion.hf_export import export_dream_hf
    from models.llama.modeling import param_dtype

    dtype = str(param_dtype(v.params))
    dev = torch_device("auto")
    folder = export_dream_hf(
        work / "dream-hf",
        v.model,
        v.params,
        eos_ids=v.eos_ids,
        pad_id=v.pad_id,
        torch_dtype=dtype,
    )
    return load_dream_hf(folder, dtype=dtype, device=dev), dtype, dev


def fastdllm_dream_rows(
    vehicles: dict,
    prompts: dict,
    settings,
    n: int,
    deadline_s: float,
    *,
    threshold: float = FASTDLLM_THRESHOLD,
    log: Callable[[str], None] = print,
) -> tuple[list[dict], list[str]]:
    """The official Fast-dLLM Dream block decoder (dual cache, confidence threshold
    ``threshold``) against jaxspec's ``threshold`` method with the same block rule, on the
    dllm vehicle exported to the Hugging Face Dream layout, on the first ``n`` dllm prompts
    (greedy, batch 1, ``settings.gen_length`` / ``settings.block_length``). Prompts stop
    when ``deadline_s`` seconds have passed. Returns ``(rows, notes)``: the
    ``jaxspec/threshold`` row (the reference of this pair) and the ``fast-dllm`` row with
    ``identical`` against it; one skipped or failed row when the peer cannot run."""
    import tempfile

    t0 = time.perf_counter()
    sys_, meth = DREAM_PEER
    v = vehicles.get("dllm")
    head = getattr(getattr(getattr(v, "model", None), "config", None), "head", None)
    if head != "dream":
        return [{"system": sys_, "method": meth, "skipped": "no Dream-head dllm vehicle"}], []
    if deadline_s <= 0:
        return [{"system": sys_, "method": meth, "skipped": "no time left in the budget"}], []
    with tempfile.TemporaryDirectory(prefix="jaxspec-dream-hf-") as td:
        try:
            hf, dtype, dev = _load_official_dream(v, Path(td))
        except PeerUnavailable as e:
            return [{"system": sys_, "method": meth, "skipped": str(e)}], []
        except Exception as e:  # noqa: BLE001 - e.g. a vehicle layout the export refuses
            log(f"[peers] fast-dllm dream not loaded: {one_line(e)}")
            return [{"system": sys_, "method": meth, "failed": True, "skipped": one_line(e)}], []
    ours = _jaxspec_dream_decoder(v, settings, threshold)
    theirs = _official_dream_decoder(hf, v, settings, threshold)
    ids = prompts["dllm"][:n]
    try:
        theirs(ids[0])  # untimed warm-up (CUDA context, kernels)
        outs = {"jaxspec": [], "official": []}
        for p in ids:
            if outs["jaxspec"] and time.perf_counter() - t0 > deadline_s:
                break
            outs["jaxspec"].append(ours(p))
            outs["official"].append(theirs(p))
    except Exception as e:  # noqa: BLE001 - a failed peer is a row, not a crash
        log(f"[peers] fast-dllm dream failed: {one_line(e)}")
        return [{"system": sys_, "method": meth, "failed": True, "skipped": one_line(e)}], []
    label = f"threshold {threshold:g} (first-position, dual)"
    rows = [
        _dream_row("jaxspec", label, outs["jaxspec"], settings),
        _dream_row(sys_, meth, outs["official"], settings, ref=outs["jaxspec"]),
    ]
    import torch
    import transformers

    notes = [
        f"`fast-dllm / dream (official)`: NVlabs/Fast-dLLM's Dream block decoder "
        f"(`dream/model/generation_utils_block.py`, dual cache, threshold {threshold:g}, "
        f"block {settings.block_length}, {settings.gen_length} positions) and modeling code, "
        f"unmodified, on the dllm vehicle exported to the Hugging Face Dream layout, in "
        f"{dtype} on {dev} (torch {torch.__version__}, transformers "
        f"{transformers.__version__}; under transformers 5 two shims: the 'default' RoPE "
        "initialiser registered and `DreamGenerationConfig.validate` taking `update`'s "
        "keywords). Its `identical` compares with the jaxspec threshold row above it "
        "(same rule), not with `jaxspec/ar`; tok/s counts decoded positions; both cut at EOS.",
    ]
    if len(outs["official"]) < len(ids):
        notes.append(f"fast-dllm dream: {len(outs['official'])} of {len(ids)} prompts in time.")
    return rows, notes


# ----------------------------------------------------------------------------- Fast-dLLM LLaDA

# Fast-dLLM's LLaDA decoders (``llada/generate.py``) by the KV cache they keep; each is the
# official counterpart of jaxspec's decoder with that ``cache`` (module docstring)
FASTDLLM_LLADA_DECODERS = {
    "none": "generate",
    "prefix": "generate_with_prefix_cache",
    "dual": "generate_with_dual_cache",
}
# the LLaDA pairs ``(cache, threshold or None for stepwise)``, in the order they run while
# the time lasts: Fast-dLLM's fastest setting first, LLaDA's own one-token-per-step last
LLADA_SETTINGS = (
    ("dual", FASTDLLM_THRESHOLD),
    ("prefix", FASTDLLM_THRESHOLD),
    ("none", FASTDLLM_THRESHOLD),
    ("none", None),
)
LLADA_SYSTEM = "fast-dllm"


def load_fastdllm_llada(root: Optional[str] = None):
    """The official Fast-dLLM LLaDA decoding module (``llada/generate.py``, :func:`
    load_fastdllm`), unmodified; it imports the official modeling code
    (``llada/model/modeling_llada.py``, as the package ``model``) and exposes its
    ``LLaDAModelLM``.

    Raises:
      PeerUnavailable: no checkout, torch / transformers / einops missing, or an import
        error."""
    why = transformers_available()
    if why:
        raise PeerUnavailable(why)
    gen = load_fastdllm("llada", root)
    if not hasattr(gen, "LLaDAModelLM"):
        raise PeerUnavailable("Fast-dLLM llada/generate.py has no LLaDAModelLM")
    return gen


def load_llada_hf(folder, root: Optional[str] = None, dtype: str = "float32", device="cpu"):
    """The LLaDA folder ``folder`` (:func:`models.diffusion.hf_export.export_llada_hf`) in the
    official ``LLaDAModelLM`` (:func:`load_fastdllm_llada`), in ``dtype`` on ``device``, in
    eval mode. Returns ``(model, decoding module)``.

    Built as ``LLaDAModelLM(LLaDAConfig.from_pretrained(folder))`` with the folder's tensors
    loaded by ``load_state_dict(strict=True)``, not ``from_pretrained``: the official class
    never calls ``post_init``, which transformers 5's loader needs. Under transformers 5
    ``PretrainedConfig`` also drops ``use_cache``, which the official forward reads when a
    call leaves it out: it is set back to the folder's ``false``.

    Raises:
      PeerUnavailable: as :func:`load_fastdllm_llada`."""
    import torch
    from safetensors.torch import load_file

    gen = load_fastdllm_llada(root)
    cls = gen.LLaDAModelLM
    conf = cls.config_class.from_pretrained(str(folder))
    if not hasattr(conf, "use_cache"):
        conf.use_cache = False
    m = cls(conf)
    state = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(f)))
    m.load_state_dict(state, strict=True)
    return m.to(dtype=getattr(torch, dtype)).to(device).eval(), gen


def fastdllm_llada_generate(
    hf_model,
    gen,
    prompt: Sequence[int],
    *,
    cache: str,
    gen_length: int,
    block_length: int,
    steps: int,
    threshold: Optional[float],
    mask_id: int,
) -> tuple[list[int], int]:
    """Greedy Fast-dLLM LLaDA decoding of one prompt: the official decoder of ``cache``
    (:data:`FASTDLLM_LLADA_DECODERS` in ``gen``, :func:`load_llada_hf`) on ``hf_model`` with
    ``steps``, ``gen_length``, ``block_length``, temperature 0, ``remasking=
    "low_confidence"``, ``mask_id`` and ``threshold`` (None: the stepwise schedule).

    Returns ``(the gen_length generated ids, the forwards the official code counts)``.

    The official arg-max ranges over [MASK] too (jaxspec's never does): a position whose
    prediction is [MASK] is "transferred" and stays masked, so a threshold loop may never end
    and a stepwise block ends its schedule still masked (an ``IndexError`` in the official
    loop). Trained models do not predict [MASK]; tiny random ones can.

    Raises:
      ValueError: an unknown ``cache``.
      RuntimeError: more than ``gen_length + 2 * blocks`` forwards (each step commits a
        position unless the official code predicts [MASK] there, which would loop for
        ever), or a stepwise block still masked after its steps."""
    import torch

    if cache not in FASTDLLM_LLADA_DECODERS:
        raise ValueError(
            f"unknown cache {cache!r}; expected one of {', '.join(FASTDLLM_LLADA_DECODERS)}"
        )
    limit = gen_length + 2 * (gen_length // block_length) + 1
    dev = next(hf_model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    decode = getattr(gen, FASTDLLM_LLADA_DECODERS[cache])
    calls, handle = _count_forwards(hf_model, limit, "Fast-dLLM LLaDA")
    try:
        x, nfe = decode(
            hf_model,
            ids,
            steps=steps,
            gen_length=gen_length,
            block_length=block_length,
            temperature=0.0,
            remasking="low_confidence",
            mask_id=int(mask_id),
            threshold=None if threshold is None else float(threshold),
        )
    except IndexError as e:  # the stepwise schedule ran out with the block still masked
        raise RuntimeError(
            f"Fast-dLLM LLaDA kept a block masked past its {steps} steps ({e}): it predicts "
            "[MASK] there"
        ) from None
    finally:
        handle.remove()
    return [int(t) for t in x[0, len(prompt) :].tolist()], int(nfe)


def llada_decode_config(cache: str, threshold: Optional[float], s):
    """jaxspec's counterpart of a Fast-dLLM LLaDA decoder: ``(method, config)`` of the
    ``threshold`` method (``threshold`` set) or the ``stepwise`` reference with ``steps =
    gen_length`` (``threshold`` None), with ``cache``, ``s.gen_length`` / ``s.block_length``
    and the defaults that are LLaDA's rule (``remasking="low_confidence"``, ``block_start=
    "rule"``, ``confidence_softmax="official"``, greedy)."""
    from jaxspec.methods import get_method

    shared = dict(gen_length=s.gen_length, block_length=s.block_length, cache=cache)
    if threshold is None:
        m = get_method("stepwise", "dllm")
        return m, m.configure(steps=s.gen_length, **shared)
    m = get_method("threshold", "dllm")
    return m, m.configure(threshold=threshold, **shared)


def llada_labels(cache: str, threshold: Optional[float]) -> tuple[str, str]:
    """``(jaxspec row's method, official row's method)`` of one LLaDA pair."""
    rule = "stepwise" if threshold is None else f"threshold {threshold:g}"
    return (
        f"{rule} (llada, cache {cache})",
        f"llada {FASTDLLM_LLADA_DECODERS[cache]}, {rule} (official)",
    )


def llada_vehicle(vehicles: dict):
    """The vehicle of the LLaDA pairs and what it is: the dllm vehicle when its head is
    LLaDA's, else the dllm vehicle's weights read with the LLaDA head (logits at ``i`` score
    position ``i``; the vehicles carry no LLaDA checkpoint: its tokens are not text, its
    forwards cost what a LLaDA of that body costs). ``(None, reason)`` without a dllm
    vehicle."""
    import dataclasses

    from models.diffusion.modeling import DiffusionConfig, DiffusionLM

    v = vehicles.get("dllm")
    cfg = getattr(getattr(v, "model", None), "config", None)
    if not isinstance(cfg, DiffusionConfig):
        return None, "no dllm vehicle"
    if cfg.head == "llada":
        return v, f"the dllm vehicle {v.name}"
    model = DiffusionLM(DiffusionConfig(cfg.base, "llada", cfg.mask_token_id))
    what = (
        f"the dllm vehicle's weights ({v.name}) read with the LLaDA head: no LLaDA "
        "checkpoint is among the vehicles, so its tokens are not text; parity and cost only"
    )
    return dataclasses.replace(v, name=f"{v.name} (LLaDA head)", model=model), what


def _jaxspec_llada_decoder(v, s, cache: str, threshold: Optional[float]):
    """``prompt -> (tokens cut at EOS, NFE, seconds, compile seconds)``: jaxspec's counterpart
    of the Fast-dLLM LLaDA decoder (:func:`llada_decode_config`) on ``v``, one untimed call
    first (compilation)."""

    m, cfg = llada_decode_config(cache, threshold, s)
    return _timed_decoder(m, cfg, v)


def _official_llada_decoder(hf, gen, v, s, cache: str, threshold: Optional[float]):
    """``prompt -> (tokens cut at EOS, NFE, seconds, 0)``: the official Fast-dLLM LLaDA
    decoder of ``cache`` (:func:`fastdllm_llada_generate`), timed to the host copy of its
    output."""
    kw = dict(
        cache=cache,
        gen_length=s.gen_length,
        block_length=s.block_length,
        steps=s.gen_length,
        threshold=threshold,
        mask_id=v.model.config.mask_token_id,
    )

    def decode(prompt):
        t0 = time.perf_counter()
        toks, nfe = fastdllm_llada_generate(hf, gen, prompt, **kw)
        return cut_at_eos(toks, v.eos_ids), nfe, time.perf_counter() - t0, 0.0

    return decode


def _load_official_llada(v, work: Path):
    """``v`` exported to ``work`` (:func:`models.diffusion.hf_export.export_llada_hf`) and
    loaded by the official code (:func:`load_llada_hf`) in the vehicle's dtype on the
    transformers peers' device. Returns ``(model, decoding module, dtype, device)``."""
    from jaxspec.bench.systems import torch_device
    from models.diffusion.hf_export import export_llada_hf
    from models.llama.modeling import param_dtype

    dtype = str(param_dtype(v.params))
    dev = torch_device("auto")
    folder = export_llada_hf(
        work / "llada-hf", v.model, v.params, eos_ids=v.eos_ids, pad_id=v.pad_id, torch_dtype=dtype
    )
    hf, gen = load_llada_hf(folder, dtype=dtype, device=dev)
    return hf, gen, dtype, dev


def _llada_pair(hf, gen, v, ids, s, cache, threshold, t0, deadline_s):
    """One LLaDA pair's outputs ``{"jaxspec": [...], "official": [...]}`` (prompts until
    ``deadline_s`` seconds after ``t0``, at least one), after an untimed official warm-up."""
    ours = _jaxspec_llada_decoder(v, s, cache, threshold)
    theirs = _official_llada_decoder(hf, gen, v, s, cache, threshold)
    theirs(ids[0])  # untimed warm-up (CUDA context, kernels)
    outs = {"jaxspec": [], "official": []}
    for p in ids:
        if outs["jaxspec"] and time.perf_counter() - t0 > deadline_s:
            break
        outs["jaxspec"].append(ours(p))
        outs["official"].append(theirs(p))
    return outs


def fastdllm_llada_rows(
    vehicles: dict,
    prompts: dict,
    settings,
    n: int,
    deadline_s: float,
    *,
    pairs: Sequence[tuple[str, Optional[float]]] = LLADA_SETTINGS,
    log: Callable[[str], None] = print,
) -> tuple[list[dict], list[str]]:
    """The official Fast-dLLM LLaDA decoders against their jaxspec counterparts
    (:func:`llada_decode_config`), one pair of rows per ``(cache, threshold)`` of ``pairs``
    (threshold None: stepwise, one position per step), on :func:`llada_vehicle` exported to
    the LLaDA layout, on the first ``n`` dllm prompts (greedy, batch 1, ``settings.
    gen_length`` / ``settings.block_length``). Pairs run in order; prompts and pairs stop
    when ``deadline_s`` seconds have passed (the first pair runs one prompt at least). Returns
    ``(rows, notes)``: per pair the jaxspec row (that pair's reference) and the
    ``fast-dllm`` row with ``identical`` against it; a skipped or failed row where a pair or
    the peer cannot run."""
    import tempfile

    t0 = time.perf_counter()
    v, what = llada_vehicle(vehicles)
    labels = [llada_labels(c, t) for c, t in pairs]
    skip = lambda why, failed=False: [
        {"system": LLADA_SYSTEM, "method": official, "skipped": why}
        | ({"failed": True} if failed else {})
        for _, official in labels
    ]
    if v is None:
        return skip(what), []
    if deadline_s <= 0:
        return skip("no time left in the budget"), []
    with tempfile.TemporaryDirectory(prefix="jaxspec-llada-hf-") as td:
        try:
            hf, gen, dtype, dev = _load_official_llada(v, Path(td))
        except PeerUnavailable as e:
            return skip(str(e)), []
        except Exception as e:  # noqa: BLE001 - e.g. a vehicle layout the export refuses
            log(f"[peers] fast-dllm llada not loaded: {one_line(e)}")
            return skip(one_line(e), failed=True), []
    ids = prompts["dllm"][:n]
    rows, ran = [], []
    for (cache, threshold), (ours, official) in zip(pairs, labels):
        if rows and time.perf_counter() - t0 > deadline_s:
            rows.append(
                {
                    "system": LLADA_SYSTEM,
                    "method": official,
                    "skipped": "no time left in the budget",
                }
            )
            continue
        try:
            outs = _llada_pair(hf, gen, v, ids, settings, cache, threshold, t0, deadline_s)
        except Exception as e:  # noqa: BLE001 - a failed peer is a row, not a crash
            log(f"[peers] fast-dllm llada ({cache}) failed: {one_line(e)}")
            rows.append(
                {"system": LLADA_SYSTEM, "method": official, "failed": True, "skipped": one_line(e)}
            )
            continue
        rows += [
            _dream_row("jaxspec", ours, outs["jaxspec"], settings),
            _dream_row(LLADA_SYSTEM, official, outs["official"], settings, ref=outs["jaxspec"]),
        ]
        ran.append(len(outs["official"]))
    import torch
    import transformers

    notes = [
        f"`fast-dllm / llada ... (official)`: NVlabs/Fast-dLLM's LLaDA decoders "
        f"(`llada/generate.py`: `generate`, `generate_with_prefix_cache`, "
        f"`generate_with_dual_cache`; low_confidence remasking, block {settings.block_length}, "
        f"{settings.gen_length} positions, steps = positions) and modeling code, unmodified, "
        f"on {what}, exported to the LLaDA layout, in {dtype} on {dev} (torch "
        f"{torch.__version__}, transformers {transformers.__version__}; built by "
        "`load_state_dict` and with `use_cache` set back on its config under transformers 5). "
        "Each `identical` compares with the jaxspec row above it (the same rule: jaxspec's "
        "stepwise or threshold decoder with the same cache), not with `jaxspec/ar`. With a "
        "cache the official loop forwards once more after a block whose opening full forward "
        "unmasked it all (that forward transfers nothing): its NFE counts it, jaxspec's does "
        "not. tok/s counts decoded positions; both cut at EOS.",
    ]
    if ran and min(ran) < len(ids):
        notes.append(f"fast-dllm llada: {min(ran)} of {len(ids)} prompts in time (some pairs).")
    return rows, notes


_PEER_COLUMNS = [
    ("system", "system", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("new_tokens", "new tokens", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
    ("ttft_s", "TTFT s", "{:.3f}"),
    ("speedup_vs_baseline", "speedup vs jaxspec/ar", "{:.2f}x"),
    ("nfe_per_token", "NFE/token", "{:.3f}"),
    ("mat", "MAT", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    ("identical_share", "ident. share", "{:.2f}"),
    ("first_divergence", "1st diff", "{:g}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("failed", "failed", "{}"),
    ("skipped", "skipped", "{}"),
]


def ar_before_peers(ar, prompts: Sequence, *, log: Callable[[str], None] = print) -> dict:
    """Time ``jaxspec/ar`` (``ar``, a :class:`jaxspec.bench.systems.JaxspecSystem`) on every
    prompt before any transformers peer is loaded, by the ``ar`` suite's own protocol
    (:func:`jaxspec.bench.ar_suite.run_ar_suite`: one untimed warm-up, then each prompt). Its
    suite row is timed later, interleaved with the peers; the H200 run of 2026-11-29 had that
    row at 344 tok/s where the ``methods-causal`` page, in a process that had not loaded
    torch, had 977 tok/s on the same prompt, while on the CPU both paths time the same. The
    two figures side by side say whether loading and running the torch peers in the process
    slows jaxspec down.

    Returns ``{"tokens_per_s": median over prompts, "per_prompt": [...], "torch_loaded":
    whether torch was imported before this ran, "note": one line for the page}``."""
    from jaxspec.bench.ar_suite import run_ar_suite

    torch_loaded = "torch" in sys.modules
    res = run_ar_suite([ar], prompts, model_name="causal", progress=False, log=log)
    med = res["rows"][0]["median_tokens_per_s"]
    rates = [p["systems"][ar.name]["tokens_per_s"] for p in res["per_prompt"]]
    log(f"[peers] jaxspec/ar before the peers: {med:.1f} tok/s")
    when = "after torch was imported" if torch_loaded else "before torch was imported"
    return {
        "tokens_per_s": med,
        "per_prompt": rates,
        "torch_loaded": torch_loaded,
        "note": (
            f"`jaxspec/ar` timed alone before the transformers peers were loaded ({when}): "
            f"{med:.1f} tok/s (median over {len(rates)} prompt(s)); its row below is timed "
            "interleaved with the peers."
        ),
    }


def _jaxspec_systems(v, common: dict, draft) -> list:
    """``jaxspec/ar``, ``jaxspec/ngram`` (:data:`NGRAM_K`) and ``jaxspec/sps`` (:data:`SPS_K`,
    the truncated ``draft``) on the causal vehicle ``v``."""
    from jaxspec.bench.systems import JaxspecSystem

    return [
        JaxspecSystem("ar", v.model, v.params, **common),
        JaxspecSystem("ngram", v.model, v.params, draft_length=NGRAM_K, **common),
        JaxspecSystem(
            "sps", v.model, v.params, draft_length=SPS_K, options={"draft_model": draft}, **common
        ),
    ]


def _draft_notes(draft) -> list[str]:
    """The notes on draft lengths, the SPS draft model and the identity columns."""
    return [
        f"Draft lengths: n-gram and prompt lookup {NGRAM_K}, SPS and assisted generation "
        f"{SPS_K}; the SPS draft is the target's first {draft[0].config.num_layers} "
        "layers with its final norm and head, in both systems.",
        "`identical`: every prompt's tokens equal `jaxspec/ar`'s; `ident. share`: the "
        "share of prompts that do; `1st diff`: median first differing position.",
    ]


def _compile_shapes(static, bench_prompts, log) -> tuple[Optional[str], Optional[dict]]:
    """Decode every prompt (and its one-token run) once untimed with the compiled ``static``
    system, compiling its shapes; returns ``(note, None)``, or ``(None, failed row)`` (logged)
    when it raises."""
    w0 = time.perf_counter()
    try:
        for p in bench_prompts:
            static.run(p.ids)
            static.run(p.ids, max_new_tokens=1)
        return (
            f"`transformers/ar-static-compile`: the static cache is sized per "
            f"prompt length, so every prompt (and its one-token run) was decoded "
            f"once untimed first, compiling its shapes "
            f"({time.perf_counter() - w0:.1f} s in all).",
            None,
        )
    except Exception as e:  # noqa: BLE001 - a failed peer is a row, not a crash
        row = failed_row(static, one_line(e))
        log(f"[peers] {static.name} failed while compiling: {one_line(e)}")
        return None, row


def _transformers_systems(v, draft, common, bench_prompts, compile, compile_options, log):
    """The transformers peers on the causal vehicle's HF copy (static-cache AR, compiled
    first when ``compile``, prompt lookup, assisted generation); returns ``(systems, notes,
    skipped rows)``: without transformers or an HF copy, no systems and a skipped row each."""
    from jaxspec.bench.systems import TransformersSystem, load_transformers_model, torch_device
    from models.llama.modeling import param_dtype

    why = transformers_available() or (
        None if v.hf_path else "the causal vehicle has no transformers copy"
    )
    if why is not None:
        skipped = [
            {"system": "transformers", "method": m, "skipped": why}
            for m in ("ar-static-compile", "prompt-lookup", "assisted")
        ]
        return [], [], skipped
    import torch

    dev = torch_device("auto")
    use_compile = (dev == "cuda") if compile is None else bool(compile)
    dtype = str(param_dtype(v.params))
    hf = load_transformers_model(v.hf_path, dtype=dtype, device=dev)
    assistant = truncated_hf(hf, draft[0].config.num_layers)
    static = static_compiled_system(
        hf, compile=use_compile, compile_options=compile_options, **common
    )
    notes, skipped = [], []
    if use_compile:  # compile every prompt's shapes before timing (see the note)
        note, failed = _compile_shapes(static, bench_prompts, log)
        notes += [note] if note else []
        if failed:
            skipped.append(failed)
            static = None
    systems = [s for s in [static] if s is not None] + [
        TransformersSystem("prompt-lookup", hf, draft_length=NGRAM_K, **common),
        TransformersSystem("assisted", hf, draft_length=SPS_K, assistant=assistant, **common),
    ]
    notes.append(f"transformers on {dev} in {dtype}; torch {torch.__version__}.")
    return systems, notes, skipped


def run_peers_suite(
    vehicles: dict,
    prompts: dict,
    settings,
    deadline_s: float,
    *,
    compile: Optional[bool] = None,
    limit: Optional[int] = None,
    compile_options: Optional[dict] = None,
    log: Callable[[str], None] = print,
) -> dict:
    """The ``peers`` suite on the causal vehicle, then, with the time left, the Fast-dLLM
    Dream pair on the dllm vehicle (:func:`fastdllm_dream_rows`, half the time left) and the
    Fast-dLLM LLaDA pairs (:func:`fastdllm_llada_rows`, the rest), both on the same prompt
    count (module docstring); returns ``{"rows", "columns", "notes", "title"}``. ``compile``
    (default: on a CUDA device only) picks ``ar-static-compile`` over ``ar-static``; ``limit``
    prompts (default: 2 in smoke mode, else 4, 2 or 1 as ``deadline_s`` allows: >= 150 s,
    >= 60 s, less); ``compile_options``: :func:`static_compiled_system`'s. Peers that cannot
    run here get rows saying why; a peer that raises gets a row marked ``failed`` with its
    one-line error (:func:`run_contained`), never a crash of the run."""
    from jaxspec.bench.ar_suite import run_ar_suite
    from jaxspec.bench.machine import streamed_params
    from jaxspec.bench.records import BenchPrompt
    from models.llama.modeling import param_dtype

    t0 = time.perf_counter()
    v = vehicles["causal"]
    smoke = settings.max_new_tokens < 32
    n = limit or (2 if smoke else 4 if deadline_s >= 150 else 2 if deadline_s >= 60 else 1)
    ids = prompts["causal"][:n]
    bench_prompts = [BenchPrompt(t, list(p)) for t, p in zip(prompts["task_ids"], ids)]
    common = dict(max_new_tokens=settings.max_new_tokens, eos_ids=v.eos_ids, pad_id=v.pad_id)
    draft = truncated_draft(v, settings.sps_draft_layers)
    systems = _jaxspec_systems(v, common, draft)
    notes = _draft_notes(draft)
    alone = ar_before_peers(systems[0], bench_prompts, log=log)
    notes.append(alone["note"])
    hf_systems, hf_notes, skipped = _transformers_systems(
        v, draft, common, bench_prompts, compile, compile_options, log
    )
    systems += hf_systems
    notes += hf_notes
    result, failed = run_contained(
        systems,
        lambda active: run_ar_suite(
            active,
            bench_prompts,
            model_name=v.name,
            num_params=None if smoke else streamed_params(v.params),
            param_dtype=str(param_dtype(v.params)),
            progress=False,
            log=log,
        ),
        log=log,
    )
    left = max(deadline_s - (time.perf_counter() - t0), 0.0)
    dream_rows, dream_notes = fastdllm_dream_rows(vehicles, prompts, settings, n, left / 2, log=log)
    left = max(deadline_s - (time.perf_counter() - t0), 0.0)
    llada_rows, llada_notes = fastdllm_llada_rows(vehicles, prompts, settings, n, left, log=log)
    notes += dream_notes + llada_notes
    if failed:
        notes.append(
            "A system that raised is a row marked failed with its error; the suite ran again "
            "without it (its rows come from that run)."
        )
    log(f"[peers] {len(systems)} systems on {n} prompt(s) in {time.perf_counter() - t0:.1f} s")
    result = result or {"rows": []}
    return {
        "rows": result["rows"] + failed + dream_rows + skipped + llada_rows,
        "columns": _PEER_COLUMNS,
        "notes": notes,
        "bandwidth": result.get("bandwidth"),
        "ar_before_peers": {k: x for k, x in alone.items() if k != "note"},
        "title": "Peers on the same device, weights, prompts and budget (greedy, batch 1)",
    }
