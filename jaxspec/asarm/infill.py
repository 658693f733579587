"""Infilling templates, HumanEval single-line infilling tasks and a sandboxed pass@1 runner.

**Template syntax.** Plain text in which every ``<mask:N>`` tag (``N`` a positive decimal
integer) stands for ``N`` tokens the model must generate, inline::

    "def add(a, b):\\n    <mask:8>\\n"          # 8 masked tokens between the two text pieces

The literal text pieces are tokenized one by one (so a piece's tokens never merge with a
masked span's) and concatenated with ``N`` mask slots per tag; the result is a token sequence
plus a boolean mask, the input of :func:`jaxspec.asarm.assd.assd_generate`. Anything that looks like
a tag but is not well formed (``<mask:>``, ``<mask:x>``, ``<mask:0>``) is an error, so a typo
never silently becomes literal text. On the command line (``scripts.generate --infill``) the
two-character escapes ``\\n``, ``\\t`` and ``\\\\`` are expanded first
(:func:`unescape_cli`), because shells pass ``"...\\n..."`` through literally.

**HumanEval single-line infilling** (ASSD paper Appendix E.7, following Gong et al. 2024 /
Bavarian et al. 2022): for every non-blank line of every canonical solution, the line is
removed and must be infilled given the prompt and the rest of the solution. The line's
indentation stays in the prefix (the paper inserts the ground-truth indentation for its
baseline for the same reason) and the masked span has the oracle length: the number of tokens
of the removed line's text (plus ``extra_masks``). A completion passes when the program (prompt
+ solution with the infilled line + the problem's tests + ``check(entry_point)``) exits with
status 0.

**Sandbox** (:func:`run_program`): model output is never executed in this process. Each program
runs in a fresh ``python -I -S`` subprocess (isolated mode: no environment variables, no user
site, no site-packages) in a temporary working directory, with a stripped environment and its
own session (the whole process group is killed on timeout), and

* no network: a new, empty network namespace (``unshare -n``, or ``unshare -r -n`` for a
  non-root user). Where the system allows neither, :func:`run_program` refuses to run model code
  (:class:`SandboxUnavailable`) unless weak sandboxing is allowed explicitly;
* as root, a throwaway user id with no account (``setpriv --reuid``, no groups, no new
  privileges): the program cannot write the caller's files, cannot raise the limits below back,
  and every process it leaves behind (even one that left the session) is killed by uid at the
  end. A non-root caller's programs run as the caller;
* resource limits set by the child before the program starts (CPU seconds, address space, file
  size, open files, 16 processes, no core dumps; no ``preexec_fn``, so nothing runs between fork
  and exec of the multithreaded parent); stdout / stderr go to files bounded by the file-size
  limit;
* a guard executed before the program that makes sockets, name resolution, process spawning,
  ``os.system``, file deletion / renaming and ``setrlimit`` raise. The guard is a seat belt for
  mistakes, not a security boundary against hostile code; the namespace, the uid and the limits
  are the walls.

A program passes only if it exits with status 0 *after* its last line (a marker printed at the
end of the program): ``sys.exit(0)`` in an infilled line does not count as a pass.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence, Union

from models.registry import REPO_ROOT

_TAG = re.compile(r"<mask:(\d+)>")
_LOOSE = re.compile(r"<mask:[^>\n]{0,32}>?")


class TemplateError(ValueError):
    """A malformed infilling template (no masks, bad tag, past the context)."""


@dataclasses.dataclass
class InfillTemplate:
    """A parsed template.

    Attributes:
      ids: int token ids (mask slots hold ``fill_id``).
      masked: bool per token, True at the positions to generate.
      pieces: the template as a list of literal ``str`` pieces and ``int`` mask counts.
      spans: ``(start, stop)`` token ranges of the masked spans, in order.
    """

    ids: list
    masked: list
    pieces: list
    spans: list

    def render(self, ids: Sequence[int], decode: Callable[[list], str]) -> str:
        """The text with every masked span replaced by ``decode`` of its tokens in ``ids``
        (a full sequence as returned by the decoder); literal pieces are kept verbatim."""
        out, s = [], 0
        for p in self.pieces:
            if isinstance(p, str):
                out.append(p)
            else:
                a, b = self.spans[s]
                out.append(decode([int(t) for t in ids[a:b]]))
                s += 1
        return "".join(out)


def split_template(text: str) -> list:
    """``text`` -> alternating literal pieces (``str``, empty ones dropped) and mask counts
    (``int``).

    Raises:
      TemplateError: a malformed ``<mask:...>`` tag or ``N < 1`` (one line, with the offset).
    """
    pieces: list = []
    pos = 0
    for m in _LOOSE.finditer(text):
        good = _TAG.fullmatch(m.group(0))
        if not good:
            raise TemplateError(f"malformed mask tag {m.group(0)!r} at character {m.start()}; "
                                "expected <mask:N> with N a positive integer")
        n = int(good.group(1))
        if n < 1:
            raise TemplateError(f"mask tag {m.group(0)!r} at character {m.start()} asks for "
                                f"{n} tokens; N must be >= 1")
        if m.start() > pos:
            pieces.append(text[pos:m.start()])
        pieces.append(n)
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def build_template(pieces: Sequence[Union[str, int]], encode: Callable[[str], list],
                   max_len: Optional[int] = None, fill_id: int = 0) -> InfillTemplate:
    """Tokenize literal pieces one by one and insert the mask slots.

    Args:
      pieces: ``str`` literal text or ``int`` number of masked tokens.
      encode: text -> token ids (e.g. ``tokenizer.encode``).
      max_len: optional context limit in tokens.
      fill_id: the id stored at masked slots (ignored by the decoder).

    Raises:
      TemplateError: no masked span, or a span (or the text) running past ``max_len``.
    """
    ids, masked, spans = [], [], []
    for p in pieces:
        if isinstance(p, str):
            t = [int(x) for x in encode(p)]
            ids += t
            masked += [False] * len(t)
        else:
            spans.append((len(ids), len(ids) + int(p)))
            ids += [int(fill_id)] * int(p)
            masked += [True] * int(p)
    if not spans:
        raise TemplateError("template has no <mask:N> span: nothing to infill")
    if max_len is not None and len(ids) > max_len:
        for i, (a, b) in enumerate(spans):
            if b > max_len:
                raise TemplateError(f"mask span {i + 1} (tokens {a}..{b - 1}) runs past the "
                                    f"context of {max_len} tokens")
        raise TemplateError(f"template of {len(ids)} tokens runs past the context of "
                            f"{max_len} tokens")
    return InfillTemplate(ids=ids, masked=masked, pieces=list(pieces), spans=spans)


_CLI_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape_cli(text: str) -> str:
    """Expand the escapes ``\\n`` (newline), ``\\t`` (tab) and ``\\\\`` (backslash) of a
    template typed on a command line; any other backslash is kept as written."""
    return re.sub(r"\\([nt\\])", lambda m: _CLI_ESCAPES[m.group(1)], text)


def parse_template(text: str, tokenizer, max_len: Optional[int] = None,
                   fill_id: int = 0) -> InfillTemplate:
    """Parse an infilling template (module docstring) with ``tokenizer`` (an object with
    ``encode(str) -> list[int]``, or such a callable).

    Returns:
      :class:`InfillTemplate`: ``ids`` and ``masked`` of equal length.

    Raises:
      TemplateError (a ValueError): malformed tag, ``N < 1``, no masks, past ``max_len``.
    """
    encode = tokenizer if callable(tokenizer) and not hasattr(tokenizer, "encode") else tokenizer.encode
    return build_template(split_template(text), encode, max_len, fill_id)


# --------------------------------------------------------------------------- HumanEval
@dataclasses.dataclass(frozen=True)
class LineTask:
    """One HumanEval single-line infilling task.

    Attributes:
      task_id: ``"HumanEval/<p>/L<i>"``; problem: the problem's ``task_id``; line: index ``i`` of
      the removed line in the canonical solution; prefix: prompt + solution lines before it;
      indent: the removed line's leading whitespace; target: the removed text (after
      ``indent``); suffix: solution lines after it; test, entry_point: from the problem.
    """

    task_id: str
    problem: str
    line: int
    prefix: str
    indent: str
    target: str
    suffix: str
    test: str
    entry_point: str

    def program(self, fill: str) -> str:
        """The full program with ``fill`` as the removed line's text."""
        return (self.prefix + self.indent + fill + "\n" + self.suffix + "\n\n" + self.test
                + f"\n\ncheck({self.entry_point})\n")

    def pieces(self, n_masks: int) -> list:
        """Template pieces: prefix + indentation, ``n_masks`` masks, newline + suffix."""
        return [self.prefix + self.indent, int(n_masks), "\n" + self.suffix]


def single_line_tasks(problems: Optional[Sequence[dict]] = None,
                      limit: Optional[int] = None) -> list:
    """Single-line infilling tasks (module docstring), problem by problem, line by line.

    Args:
      problems: HumanEval problems (default: :func:`jaxspec.eval.datasets.humaneval_problems`).
      limit: keep the first ``limit`` tasks.
    """
    if problems is None:
        from jaxspec.eval.datasets import humaneval_problems

        problems = humaneval_problems()
    out = []
    for p in problems:
        lines = p["canonical_solution"].split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            body = line.lstrip()
            indent = line[:len(line) - len(body)]
            prefix = p["prompt"] + "".join(x + "\n" for x in lines[:i])
            out.append(LineTask(task_id=f"{p['task_id']}/L{i}", problem=p["task_id"], line=i,
                                prefix=prefix, indent=indent, target=body.rstrip(),
                                suffix="\n".join(lines[i + 1:]), test=p["test"],
                                entry_point=p["entry_point"]))
            if limit is not None and len(out) >= limit:
                return out
    return out


def line_template(task: LineTask, tokenizer, extra_masks: int = 0,
                  max_len: Optional[int] = None) -> InfillTemplate:
    """Template of ``task`` with the oracle span length ``len(encode(target)) + extra_masks``."""
    encode = tokenizer.encode if hasattr(tokenizer, "encode") else tokenizer
    n = max(1, len(encode(task.target)) + int(extra_masks))
    return build_template(task.pieces(n), encode, max_len)


def fill_text(template: InfillTemplate, ids: Sequence[int], decode: Callable[[list], str]) -> str:
    """The decoded text of the first masked span (the infilled line), cut at its first newline
    (a single-line task can only use one line), without leading spaces or tabs: the template
    already holds the line's indentation, and a BPE tokenizer's word-initial space token would
    otherwise indent the line once more (the paper's Appendix E.7 strips the leading space)."""
    a, b = template.spans[0]
    return decode([int(t) for t in ids[a:b]]).split("\n")[0].lstrip(" \t")


# --------------------------------------------------------------------------- sandbox
_GUARD = r"""
def _jaxspec_sandbox_guard(cpu_s, memory_mb):
    import os, posix, resource, shutil, socket
    for lim, val in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_FSIZE, 16 << 20),
                     (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0),
                     (resource.RLIMIT_NPROC, 16), (resource.RLIMIT_AS, memory_mb << 20)):
        try:
            resource.setrlimit(lim, (val, val))
        except (ValueError, OSError):
            pass
    def _blocked(*a, **k):
        raise PermissionError("blocked by the jaxspec sandbox")
    resource.setrlimit = _blocked
    class _NoSocket(socket.socket):
        def __init__(self, *a, **k):
            _blocked()
    socket.socket = _NoSocket
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr", "socketpair", "fromfd"):
        if hasattr(socket, name):
            setattr(socket, name, _blocked)
    for mod in (os, posix):
        for name in ("system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
                     "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnl",
                     "posix_spawn", "posix_spawnp", "kill", "killpg", "putenv", "unsetenv",
                     "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace",
                     "chmod", "chown", "truncate", "setsid", "setuid", "setgid"):
            if hasattr(mod, name):
                setattr(mod, name, _blocked)
    shutil.rmtree = shutil.move = _blocked
    import subprocess
    subprocess.Popen = _blocked
    subprocess.run = subprocess.call = subprocess.check_call = subprocess.check_output = _blocked
    try:
        import _posixsubprocess
        _posixsubprocess.fork_exec = _blocked
    except ImportError:
        pass
_jaxspec_sandbox_guard(%(cpu)d, %(mem)d)
del _jaxspec_sandbox_guard
"""

ALLOW_WEAK_ENV = "JAXSPEC_ALLOW_WEAK_SANDBOX"


class SandboxUnavailable(RuntimeError):
    """The system gives no kernel isolation (no network namespace) and weak sandboxing was not
    allowed (``JAXSPEC_ALLOW_WEAK_SANDBOX=1`` or ``allow_weak=True``)."""


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one sandboxed program.

    Attributes:
      status: ``"passed"`` (exit 0 *and* the end of the program reached: a program that calls
        ``sys.exit(0)`` / ``os._exit(0)`` before its tests finish does not pass), ``"failed"``
        (anything else but a timeout) or ``"timeout"`` (wall-clock or CPU limit).
      returncode: the exit status (negative: signal); None after a wall-clock kill.
      seconds: wall-clock seconds.
      stderr: the last 2000 characters of stderr.
      network: the network isolation used: ``"netns"`` (empty network namespace) or
        ``"guard"`` (the Python guard only).
      uid: the throwaway user id the program ran as (None: it ran as the caller).
    """

    status: str
    returncode: Optional[int]
    seconds: float
    stderr: str
    network: str
    uid: Optional[int] = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _works(cmd, cwd="/") -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20, cwd=cwd).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _throwaway_uid() -> int:
    """A fresh user id with no account (so no files and no other processes): the program's
    processes are exactly the processes of this uid."""
    import secrets

    return 200_000_000 + secrets.randbelow(100_000_000)


def _drop(uid: int, setpriv: str) -> list:
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]


@functools.lru_cache(maxsize=4)
def _isolation(python: str) -> tuple:
    """``(netns prefix, setpriv path or None)`` that this system allows, probed once.

    As root: ``unshare -n`` then ``setpriv`` to a throwaway uid (the program can then neither
    write the caller's files nor raise its limits back, and leftover processes are reaped by
    uid) when ``python`` still starts that way. As another user: ``unshare -r -n`` (a user +
    network namespace), running as the caller.
    """
    exe, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if exe is None:
        return (), None
    if os.geteuid() == 0:
        net = (exe, "-n", "--")
        if not _works(list(net) + ["true"]):
            net = (exe, "-r", "-n", "--")
            if not _works(list(net) + ["true"]):
                return (), None
        if setpriv and _works(list(net) + _drop(_throwaway_uid(), setpriv) + [python, "-I", "-S", "-c", "pass"]):
            return net, setpriv
        return net, None
    net = (exe, "-r", "-n", "--")
    return (net, None) if _works(list(net) + ["true"]) else ((), None)


def _reap(uid: int, setpriv: str) -> None:
    """Kill every process left by the throwaway ``uid`` (daemons that left the session)."""
    kill = shutil.which("kill")
    if kill:
        subprocess.run(_drop(uid, setpriv) + [kill, "-KILL", "-1"], capture_output=True, timeout=20)


def _tail(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(f.tell() - n, 0))
        return f.read()


def run_program(source: str, timeout: float = 10.0, memory_mb: int = 1024,
                python: Optional[str] = None, allow_weak: Optional[bool] = None) -> SandboxResult:
    """Run ``source`` in the sandbox of the module docstring.

    Args:
      source: a complete Python program (e.g. :meth:`LineTask.program`).
      timeout: wall-clock seconds (the CPU limit is ``ceil(timeout) + 1``).
      memory_mb: address-space limit.
      python: interpreter (default ``sys.executable``).
      allow_weak: run behind the Python guard alone when the system gives no network namespace
        (default: the environment variable ``JAXSPEC_ALLOW_WEAK_SANDBOX=1``).

    Returns:
      :class:`SandboxResult`.

    Raises:
      SandboxUnavailable: no network namespace here and weak sandboxing not allowed.
    """
    import secrets

    python = python or sys.executable
    net, setpriv = _isolation(python)
    if not net:
        if allow_weak is None:
            allow_weak = os.environ.get(ALLOW_WEAK_ENV, "") == "1"
        if not allow_weak:
            raise SandboxUnavailable(
                "no network namespace available (unshare -n / -r -n failed): model-written code "
                f"is not run; set {ALLOW_WEAK_ENV}=1 to run it behind the Python guard only")
    uid = _throwaway_uid() if setpriv else None
    marker = "jaxspec-sandbox-end-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="jaxspec-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_GUARD % {"cpu": int(timeout) + 2, "mem": int(memory_mb)} + "\n" + source
                    + f"\nprint({marker!r}, flush=True)\n")
        out_p, err_p = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        if uid is not None:
            os.chown(tmp, uid, uid)
        cmd = list(net) + (_drop(uid, setpriv) if uid is not None else []) + [python, "-I", "-S", "program.py"]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp}
        t0 = time.perf_counter()
        try:
            with open(out_p, "wb") as out, open(err_p, "wb") as err:
                proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True)
                try:
                    rc = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
                    rc = None
        finally:
            if uid is not None:
                _reap(uid, setpriv)
        secs = time.perf_counter() - t0
        stderr = _tail(err_p, 4000).decode("utf-8", "replace")[-2000:]
        reached_end = marker.encode() in _tail(out_p, 4096)
    if rc is None or rc in (-signal.SIGXCPU, -signal.SIGKILL):
        status = "timeout"
    elif rc == 0 and reached_end:
        status = "passed"
    else:
        status = "failed"
        if rc == 0:
            stderr = (stderr + "\n[sandbox] exited with status 0 before the end of the program")[-2000:]
    return SandboxResult(status=status, returncode=rc, seconds=secs, stderr=stderr,
                         network="netns" if net else "guard", uid=uid)


def pass_at_1(results: Sequence[SandboxResult]) -> float:
    """Share of passed programs (one completion per task: pass@1 as in Appendix E.7)."""
    return sum(r.passed for r in results) / max(len(results), 1)


# --------------------------------------------------------------------------- AS-ARM CLI glue
@dataclasses.dataclass
class ASARM:
    """A loaded AS-ARM checkpoint (:func:`load_asarm`).

    Attributes:
      model, params: :class:`models.xlnet.modeling.XLNetLM` and float32 parameters.
      vocab: :class:`models.xlnet.modeling.CompactVocab` mapping model ids to tokenizer ids, or None
        (the model speaks the tokenizer's ids).
      tokenizer: text <-> tokenizer ids (``encode``/``decode``).
      meta: the checkpoint's metadata; path: the weight file; max_len: context limit.
    """

    model: object
    params: dict
    vocab: object
    tokenizer: object
    meta: dict
    path: str
    max_len: Optional[int]

    def to_model(self, ext_ids: Sequence[int]) -> list:
        """Tokenizer ids -> model ids (ids outside the compact vocabulary become UNK)."""
        return [int(i) for i in (self.vocab.encode(ext_ids) if self.vocab is not None else ext_ids)]

    def to_external(self, model_ids: Sequence[int]) -> list:
        """Model ids -> tokenizer ids (UNK becomes -1)."""
        return [int(i) for i in (self.vocab.decode(model_ids) if self.vocab is not None else model_ids)]

    def decode(self, model_ids: Sequence[int]) -> str:
        """Text of model ids; each UNK is written as ``<unk>``."""
        out, run = [], []
        for t in self.to_external(model_ids):
            if t < 0:
                out.append(self.tokenizer.decode(run) + "<unk>")
                run = []
            else:
                run.append(t)
        return "".join(out) + self.tokenizer.decode(run)


def load_asarm(name_or_path: str, tokenizer=None, log=lambda m: print(m, file=sys.stderr)) -> ASARM:
    """Load an XLNet AS-ARM written by :func:`models.xlnet.modeling.save_xlnet`.

    Args:
      name_or_path: a ``.safetensors`` file, a directory holding ``model.safetensors``, or a
        name ``NAME`` for ``checkpoints/NAME/model.safetensors`` of this repository.
      tokenizer: optional tokenizer; default the preset named by the checkpoint's
        ``meta["tokenizer"]`` (``smollm2-135m-instruct`` when absent).

    Returns:
      :class:`ASARM`; ``max_len`` is ``meta["seq_len"]`` when recorded, else 512.

    Raises:
      models.llama.params.WeightFileError: no such checkpoint or an unreadable file (one line).
    """
    from pathlib import Path

    from models.llama.params import WeightFileError
    from models.xlnet.modeling import XLNetLM, load_xlnet

    p = Path(name_or_path)
    if not p.exists() and "/" not in name_or_path and not name_or_path.endswith(".safetensors"):
        p = REPO_ROOT / "checkpoints" / name_or_path
        if not p.exists():
            raise WeightFileError(f"unknown AS-ARM {name_or_path!r}: neither a file nor {p}")
    if p.is_dir():
        p = p / "model.safetensors"
        if not p.is_file():
            raise WeightFileError(f"{p}: no AS-ARM weights yet (train them with "
                                  f"python -m scripts.train --config configs/train/<name>.yaml)")
    config, params, vocab, meta = load_xlnet(p)
    if tokenizer is None:
        from jaxspec.training.train import load_tokenizer_preset

        tokenizer = load_tokenizer_preset(meta.get("tokenizer") or "smollm2-135m-instruct", log)
    return ASARM(model=XLNetLM(config), params=params, vocab=vocab, tokenizer=tokenizer, meta=meta,
                 path=str(p), max_len=int(meta.get("seq_len", 512)))


def infill_text(asarm: ASARM, template: str, *, method: str = "assd", k: int = 5, sampling=None,
                seed: int = 0, epsilon: float = 0.0):
    """Parse ``template`` (``<mask:N>`` syntax) and infill it with :func:`jaxspec.asarm.assd.assd_generate`.

    Returns:
      ``(text, InfillResult, InfillTemplate)``: the template with every span filled.

    Raises:
      TemplateError / ValueError: a bad template or decoding settings (one line).
    """
    from jaxspec.asarm.assd import assd_generate
    from jaxspec.core.sampling import SamplingConfig

    tpl = parse_template(template, asarm.tokenizer, max_len=asarm.max_len)
    ids = asarm.to_model(tpl.ids)
    res = assd_generate(asarm.model, asarm.params, [ids], [tpl.masked], method=method, k=k,
                        sampling=sampling or SamplingConfig(), seed=seed, epsilon=epsilon,
                        max_len=asarm.max_len)
    return tpl.render(res.sequences[0], asarm.decode), res, tpl


def stats_line(res) -> str:
    """One line: masked tokens, NFE, NFE per token, tokens per iteration, acceptance, times."""
    s = res.stats
    acc = "-" if s.draft_length == 0 else f"{s.acceptance_rate:.3f}"
    return (f"[{s.method}] masked={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"NFE/token={s.nfe_per_token:.3f} tokens/iteration={s.extra['tokens_per_iteration']:.2f} "
            f"k={s.extra['k'] if s.extra['k'] is not None else '-'} acceptance={acc} "
            f"lossless={'yes' if s.extra['lossless'] else 'NO (epsilon)'} run={res.run_s:.2f}s "
            f"compile={res.compile_s:.1f}s")


def infill_cli(args) -> int:
    """``scripts.generate`` entry for AS-ARMs: ``--model NAME|PATH --method
    sequential|assd|assd-ngram --infill TEMPLATE [--draft-length K (default 5)] [--temperature
    T --top-k K --top-p P --seed S] [--epsilon E] [--compare] [--quiet]``. Prints the infilled
    text and a stats line; ``--compare`` also runs sequential decoding and reports identity
    (greedy: a mismatch exits 1) and the NFE / wall-clock ratios. Exit 2 with one ``error:``
    line on bad input."""
    from jaxspec.core.sampling import SamplingConfig
    from models.llama.params import WeightFileError

    method = getattr(args, "method", None) or "assd"
    template = getattr(args, "infill", None)
    try:
        if template is None:
            raise ValueError(f"method {method!r} infills a template: pass --infill TEXT with "
                             "<mask:N> spans")
        template = unescape_cli(template)
        k = getattr(args, "draft_length", None)
        k = 5 if k is None else k
        if k < 1:
            raise ValueError(f"--draft-length (k) must be >= 1, got {k}")
        sampling = SamplingConfig(getattr(args, "temperature", 0.0), getattr(args, "top_k", 0),
                                  getattr(args, "top_p", 1.0))
        asarm = load_asarm(getattr(args, "weights", None) or args.model)
        kw = dict(k=k, sampling=sampling, seed=getattr(args, "seed", 0))
        text, res, tpl = infill_text(asarm, template, method=method,
                                     epsilon=getattr(args, "epsilon", 0.0) or 0.0, **kw)
        ref = None
        if getattr(args, "compare", False) and method != "sequential":
            _, ref, _ = infill_text(asarm, template, method="sequential", **kw)
    except (WeightFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not getattr(args, "quiet", False):
        print("=" * 80)
        print(text)
        print("=" * 80)
    print(stats_line(res))
    if ref is not None:
        same = all((a == b).all() for a, b in zip(ref.sequences, res.sequences))
        what = "identical" if same else "DIFFERENT"
        if not sampling.greedy:
            what += " (sampling: only the distribution is guaranteed equal)"
        print(stats_line(ref))
        print(f"[compare] {method} vs sequential outputs: {what}; wall-clock speedup "
              f"{ref.run_s / max(res.run_s, 1e-9):.2f}x; NFE ratio "
              f"{ref.stats.target_nfe.sum() / max(res.stats.target_nfe.sum(), 1):.2f}x")
        if sampling.greedy and not same:
            return 1
    return 0


__all__ = ["TemplateError", "InfillTemplate", "split_template", "build_template",
           "parse_template", "unescape_cli", "LineTask", "single_line_tasks", "line_template", "fill_text",
           "SandboxResult", "SandboxUnavailable", "ALLOW_WEAK_ENV", "run_program", "pass_at_1", "ASARM", "load_asarm", "infill_text",
           "stats_line", "infill_cli"]
