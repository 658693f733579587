"""Sandboxed execution of model-written Python programs and pass@1 (ASSD paper Appendix E.7).

**Sandbox** (:func:`run_program`). Model output is never executed in this process. Each program
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
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

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
        if setpriv and _works(
            list(net) + _drop(_throwaway_uid(), setpriv) + [python, "-I", "-S", "-c", "pass"]
        ):
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


def run_program(
    source: str,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    python: Optional[str] = None,
    allow_weak: Optional[bool] = None,
) -> SandboxResult:
    """Run ``source`` in the sandbox of the module docstring.

    Args:
      source: a complete Python program (e.g. :meth:`jaxspec.eval.tasks.LineTask.program`).
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
    python = python or sys.executable
    net, setpriv = _isolation(python)
    if not net:
        if allow_weak is None:
            allow_weak = os.environ.get(ALLOW_WEAK_ENV, "") == "1"
        if not allow_weak:
            raise SandboxUnavailable(
                "no network namespace available (unshare -n / -r -n failed): model-written code "
                f"is not run; set {ALLOW_WEAK_ENV}=1 to run it behind the Python guard only"
            )
    uid = _throwaway_uid() if setpriv else None
    marker = "jaxspec-sandbox-end-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="jaxspec-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                _GUARD % {"cpu": int(timeout) + 2, "mem": int(memory_mb)}
                + "\n"
                + source
                + f"\nprint({marker!r}, flush=True)\n"
            )
        out_p, err_p = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        if uid is not None:
            os.chown(tmp, uid, uid)
        cmd = (
            list(net)
            + (_drop(uid, setpriv) if uid is not None else [])
            + [python, "-I", "-S", "program.py"]
        )
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp}
        t0 = time.perf_counter()
        try:
            with open(out_p, "wb") as out, open(err_p, "wb") as err:
                proc = subprocess.Popen(
                    cmd,
                    cwd=tmp,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
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
            stderr = (stderr + "\n[sandbox] exited with status 0 before the end of the program")[
                -2000:
            ]
    return SandboxResult(
        status=status,
        returncode=rc,
        seconds=secs,
        stderr=stderr,
        network="netns" if net else "guard",
        uid=uid,
    )


def pass_at_1(results: Sequence[SandboxResult]) -> float:
    """Share of passed programs (one completion per task: pass@1 as in Appendix E.7)."""
    return sum(r.passed for r in results) / max(len(results), 1)


__all__ = ["ALLOW_WEAK_ENV", "SandboxUnavailable", "SandboxResult", "run_program", "pass_at_1"]
