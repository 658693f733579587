"""The carry plan of a device session: which calls carry which pack parts.

A device call receives the working tree plus the carried paths, at most
:data:`CARRY_MAX_BYTES` in all and at most :data:`CARRY_MAX_PATHS` paths, so a pack larger
than one call goes in several: stage calls that copy parts into a folder outside the tree
that stays while the machine is warm (:data:`STAGE_DIR`), then the call that runs the bench
(:func:`session_plan`; :func:`carry_plan` splits the pack's files alone).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable, Optional, Sequence

from jaxspec.bench.device.pack import MANIFEST, PACK_DIR, MiB

CARRY_MAX_BYTES = 64 * MiB


def travel_bytes(repo: Path, exclude: Sequence[str] = ()) -> int:
    """Bytes of the working tree a device call sends: tracked files plus untracked files
    git does not ignore (``git ls-files -co --exclude-standard``), the carried paths not
    included; ``exclude``: top-level folders left out (those a session untracks:
    :data:`UNTRACK_FOR_DEVICE`)."""
    r = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=repo,
        capture_output=True,
        check=True,
    )
    total = 0
    for name in r.stdout.decode().split("\0"):
        p = Path(repo) / name
        if not name or any(name == d or name.startswith(d + "/") for d in exclude):
            continue
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


# What a session untracks (and lists in .git/info/exclude) while the tree is over the limit a
# device call carries; the run call carries back the checkpoint folders the vehicles need.
UNTRACK_FOR_DEVICE = ("checkpoints", "results")
STAGE_DIR = "/tmp/stage"
CARRY_MAX_PATHS = 8


def vehicle_dirs(manifest: dict) -> list[str]:
    """The folders (relative to the repository root) the pack's preset vehicles read besides
    the GGUF: each delta preset's delta folder and each AS-ARM checkpoint folder."""
    from models.registry import get_preset

    out = []
    for v in manifest.get("vehicles", {}).values():
        if not isinstance(v, dict) or v.get("kind") != "preset":
            continue
        p = get_preset(v["preset"])
        rel = p.delta or p.checkpoint
        if not rel:
            continue
        d = Path(rel) if not Path(rel).suffix else Path(rel).parent
        if str(d) not in out:
            out.append(str(d))
    return out


def _path_bytes(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _size_lookup(repo: Path, sizes: dict) -> Callable[..., int]:
    """``size(rel, default=0)``: ``sizes[rel]``, else the bytes measured under ``repo``
    (``default`` for a missing path), remembered in ``sizes``."""

    def size(rel: str, default: int = 0) -> int:
        if rel not in sizes:
            p = repo / rel
            sizes[rel] = _path_bytes(p) if p.exists() else default
        return sizes[rel]

    return size


def _run_files(manifest: dict, pack: str, size, sizes: dict) -> list[str]:
    """The run call's own files (manifest, prompts, the wheels folder when packed), their
    sizes put in ``sizes`` (the manifest's measured, 64 KiB when missing)."""
    man = f"{pack}/{MANIFEST}"
    run_files = [man, f"{pack}/{manifest['prompts']['file']}"]
    size(man, 64 * 1024)
    sizes.setdefault(run_files[1], manifest["prompts"]["size"])
    if manifest.get("wheels"):
        run_files.append(f"{pack}/wheels")
        sizes.setdefault(run_files[-1], sum(w["size"] for w in manifest["wheels"]))
    return run_files


def _untrack_commands() -> tuple[list[str], list[str]]:
    """The ``untrack`` and ``restore`` shell commands for :data:`UNTRACK_FOR_DEVICE`."""
    dirs = " ".join(UNTRACK_FOR_DEVICE)
    excl = " ".join(f"/{d}/" for d in UNTRACK_FOR_DEVICE)
    sed = "; ".join(f"\\#^/{d}/$#d" for d in UNTRACK_FOR_DEVICE)
    untrack = [
        f"git rm -r -q --cached {dirs}",
        f"printf '%s\\n' {excl} >> .git/info/exclude",
    ]
    restore = [
        f"sed -i '{sed}' .git/info/exclude",
        f"git reset -q -- {dirs}",
        f"git status --short -- {dirs}  # only files new since HEAD may show",
    ]
    return untrack, restore


def _fill_run_call(parts, run_files: list[str], run_bytes: int, limit: int):
    """Parts, largest first, into the run call's spare room (bytes up to ``limit``, paths up to
    :data:`CARRY_MAX_PATHS`); returns ``(run carry, run bytes, [(part, bytes)] left over)``."""
    run_carry, todo = list(run_files), []
    for f, b in sorted(parts, key=lambda x: -x[1]):
        if run_bytes + b <= limit and len(run_carry) < CARRY_MAX_PATHS:
            run_carry.append(f)
            run_bytes += b
        else:
            todo.append((f, b))
    return run_carry, run_bytes, todo


def _stage_calls(todo, room: int, base: int, man: str, man_bytes: int, command: str) -> list:
    """The stage calls: left-over parts grouped first fit (in ``todo`` order, largest first)
    into calls of at most ``room`` bytes and :data:`CARRY_MAX_PATHS` paths with the manifest."""
    stage_calls: list[list] = []
    for f, b in todo:
        for c in stage_calls:
            if c[1] + b <= room and len(c[0]) < CARRY_MAX_PATHS - 1:
                c[0].append(f)
                c[1] += b
                break
        else:
            stage_calls.append([[f], b])
    return [
        {
            "what": "stage",
            "carry": [man, *files],
            "bytes": base + man_bytes + b,
            "command": command,
            "timeout_s": 120,
        }
        for files, b in stage_calls
    ]


def _run_call(carry: list[str], run_bytes: int, budget_s: float, pack: str, stage_dir: str):
    """The run call's record: it carries ``carry`` and runs the bench for ``budget_s``."""
    return {
        "what": "run",
        "carry": carry,
        "bytes": run_bytes,
        "command": f"PYTHONUNBUFFERED=1 python3 -m scripts.device_bench run --budget-s "
        f"{budget_s:g} --pack-dir {pack} --stage-dir {stage_dir}",
        "timeout_s": int(min(600, budget_s + 60)),
    }


def session_plan(
    manifest: dict,
    repo: Path,
    *,
    pack: str = PACK_DIR,
    stage_dir: str = STAGE_DIR,
    budget_s: float = 540.0,
    limit: int = CARRY_MAX_BYTES,
    tree_bytes: Optional[int] = None,
    untracked_tree_bytes: Optional[int] = None,
    sizes: Optional[dict[str, int]] = None,
) -> dict:
    """The device calls a session makes to run the bench from the pack ``pack`` (relative to
    ``repo``), each carrying the working tree plus at most ``limit`` bytes in all and at
    most :data:`CARRY_MAX_PATHS` paths.

    When the tree plus the run's files is over ``limit``, the session first untracks
    :data:`UNTRACK_FOR_DEVICE` (``untrack`` commands: ``git rm --cached`` and
    ``.git/info/exclude`` lines; ``restore`` undoes them after the last call), and the run
    call carries the checkpoint folders the vehicles need (:func:`vehicle_dirs`). Parts go
    first into the run call's spare room, the rest into stage calls before it (each carrying
    the manifest and running ``stage``, which copies its parts to ``stage_dir`` on the warm
    machine); the run call carries the manifest, ``prompts.json`` and the wheels and runs
    ``run``.

    ``tree_bytes`` / ``untracked_tree_bytes`` / ``sizes`` (path -> bytes) replace what is
    measured in ``repo`` (tests).

    Returns ``{"fits", "reason", "tree_bytes", "untracked_tree_bytes", "untrack", "restore",
    "calls": [{"what" ("stage" / "run"), "carry", "bytes" (tree included), "command",
    "timeout_s"}]}``."""
    repo = Path(repo)
    sizes = dict(sizes or {})
    size = _size_lookup(repo, sizes)
    man = f"{pack}/{MANIFEST}"
    run_files = _run_files(manifest, pack, size, sizes)
    parts = [(f"{pack}/{p['file']}", p["size"]) for a in manifest["artifacts"] for p in a["parts"]]
    tree = travel_bytes(repo) if tree_bytes is None else tree_bytes
    out = {
        "fits": False,
        "tree_bytes": tree,
        "untracked_tree_bytes": None,
        "untrack": [],
        "restore": [],
        "calls": [],
    }
    base = tree
    if tree + sum(size(f) for f in run_files) > limit:
        base = (
            travel_bytes(repo, UNTRACK_FOR_DEVICE)
            if untracked_tree_bytes is None
            else untracked_tree_bytes
        )
        out["untracked_tree_bytes"] = base
        out["untrack"], out["restore"] = _untrack_commands()
        run_files += vehicle_dirs(manifest)
    run_bytes = base + sum(size(f) for f in run_files)
    if run_bytes > limit:
        out["reason"] = (
            f"the run call needs {run_bytes / MiB:.1f} MiB (the tree "
            f"{base / MiB:.1f} MiB + {', '.join(run_files)}), over the {limit / MiB:.0f} MiB "
            "a call carries"
        )
        return out
    man_bytes = size(man)
    room = limit - base - man_bytes
    big = [(f, b) for f, b in parts if b > room]
    if big:
        out["reason"] = (
            f"part {big[0][0]} ({big[0][1] / MiB:.1f} MiB) does not fit beside the "
            f"{base / MiB:.1f} MiB tree and the manifest; pack with --part-max-mib "
            f"{int(room / MiB)}"
        )
        return out
    run_carry, run_bytes, todo = _fill_run_call(parts, run_files, run_bytes, limit)
    stage_cmd = f"python3 -m scripts.device_bench stage --pack-dir {pack} --stage-dir {stage_dir}"
    out["calls"] += _stage_calls(todo, room, base, man, man_bytes, stage_cmd)
    out["calls"].append(_run_call(run_carry, run_bytes, budget_s, pack, stage_dir))
    out["fits"] = True
    out["reason"] = f"{len(out['calls'])} call(s), the last one runs the bench"
    return out


def carry_plan(manifest: dict, tree_bytes: int, limit: int = CARRY_MAX_BYTES) -> dict:
    """Which pack files go in which device call. Every call sends the tree (``tree_bytes``);
    the last call also carries the manifest, prompts and wheels and runs the bench; earlier
    calls carry parts only and stage them outside the tree
    (:func:`~jaxspec.bench.device.pack.stage_parts`), which works while the machine stays warm
    between the calls (30 s idle).

    Returns ``{"calls": [[relative paths]...], "call_bytes": [...], "fits": bool,
    "reason": str}``; ``fits`` is False when the tree alone or one part leaves no room."""
    room = limit - tree_bytes
    fixed = [manifest["prompts"], *manifest.get("wheels", [])]
    fixed_bytes = sum(f["size"] for f in fixed) + 64 * 1024  # + manifest
    parts = [p for a in manifest["artifacts"] for p in a["parts"]]
    if room <= fixed_bytes:
        return {
            "calls": [],
            "call_bytes": [],
            "fits": False,
            "reason": f"the working tree alone is {tree_bytes / MiB:.1f} MiB of the "
            f"{limit / MiB:.0f} MiB a call carries: shrink it by at least "
            f"{(tree_bytes + fixed_bytes - limit) / MiB + 1:.1f} MiB first; "
            f"the {sum(p['size'] for p in parts) / MiB:.1f} MiB of parts then "
            f"travel in calls of at most (64 MiB - the tree) each",
        }
    big = [p for p in parts if p["size"] > room]
    if big:
        return {
            "calls": [],
            "call_bytes": [],
            "fits": False,
            "reason": f"part {big[0]['file']} ({big[0]['size'] / MiB:.1f} MiB) does not fit "
            f"beside the {tree_bytes / MiB:.1f} MiB tree; pack with "
            f"--part-max-mib {int((room - fixed_bytes) / MiB)}",
        }
    calls, sizes = [], []
    for p in sorted(parts, key=lambda p: -p["size"]):  # first fit, largest first
        for i, c in enumerate(calls):
            if sizes[i] + p["size"] <= room:
                c.append(p["file"])
                sizes[i] += p["size"]
                break
        else:
            calls.append([p["file"]])
            sizes.append(p["size"])
    # the run call: the one with the most room left takes the fixed files
    last = min(range(len(calls)), key=lambda i: sizes[i]) if calls else None
    if last is None or sizes[last] + fixed_bytes > room:
        calls.append([])
        sizes.append(0)
        last = len(calls) - 1
    calls[last] += [MANIFEST, fixed[0]["file"]] + [w["file"] for w in fixed[1:]]
    sizes[last] += fixed_bytes
    order = [i for i in range(len(calls)) if i != last] + [last]
    return {
        "calls": [calls[i] for i in order],
        "call_bytes": [sizes[i] + tree_bytes for i in order],
        "fits": True,
        "reason": f"{len(calls)} call(s), the last one runs the bench",
    }
