"""Compile many (spec, target) pairs: cached, deduplicated, in parallel processes.

The cache holds the parsed facts (small JSON, never code) of each compilation under
``kernelab._flags.cache_dir()/inspect``, keyed by the kernel's source key (Triton's hash of
the kernel and every helper it calls), the compile identity (signature, constexprs,
specialisations, warps, stages), the target, the triton version and this parser's version.
Worker processes are forked, so they see every kernel the parent has loaded (a user's file, a
kernel built at run time) without pickling it. They end with the run: on an exception
(Ctrl-C included) or SIGTERM they are killed, never left waiting for work
(:mod:`kernelab._workers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import orjson

from kernelab import _flags, _workers
from kernelab.inspect import parse
from kernelab.inspect.compile import backend_version, compile_artifacts
from kernelab.inspect.spec import Spec
from kernelab.inspect.targets import Target

#: Bumped whenever parsing changes what a cached entry would hold.
PARSER_VERSION = 3

_JOBS: list[tuple[Spec, Target]] = []


def cache_key(spec: Spec, target: Target) -> str:
    text = "|".join(
        (
            spec.source_key(),
            spec.identity(),
            target.name,
            spec.compiler_version()
            if hasattr(spec, "compiler_version")
            else backend_version(spec.backend),
            str(PARSER_VERSION),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _cache_path(key: str):
    return _flags.cache_dir() / "inspect" / key[:2] / f"{key}.json"


def _read(key: str) -> dict | None:
    path = _cache_path(key)
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    ok = isinstance(data, dict) and ("facts" in data or "error" in data or "unsupported" in data)
    return data if ok else None


def _write(key: str, data: dict) -> None:
    path = _cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(orjson.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs time


#: Triton's refusal of a type the architecture lacks (fp8 e4m3fn before sm_89, ...).
_UNSUPPORTED = re.compile(
    r"type (\w+) not supported in this architecture(?:\. The supported \w+ dtypes are \(([^)]*)\))?"
)


def _lower_tpu(spec, target: Target) -> dict:
    """Lower for a TPU and read the Mosaic text: ``{"facts": ...}``, or ``{"error": "does not
    lower: <the rule JAX quotes>"}`` (the first line of its message, which states the rule)."""
    from kernelab.inspect import mosaic

    try:
        art = compile_artifacts(spec, target)
        return {"facts": mosaic.parse(art)}
    except Exception as exc:  # a launch that does not lower is a result, not a crash
        return {"error": f"does not lower: {type(exc).__name__}: {lowering_rule(str(exc))}"}


def lowering_rule(text: str) -> str:
    """The rule a lowering error quotes, and the block it names: its first line, without the
    source path and the index map's jaxpr (they make the line long, and the path differs
    between machines)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    rule = lines[0] if lines else ""
    rule = re.sub(r" at \S+\.py:\d+", "", rule)
    rule = rule.split(", and index_map", 1)[0]
    return rule[:600]


def compile_one(spec: Spec, target: Target) -> dict:
    """Compile and parse: ``{"facts": ..., "triton": ...}``; ``{"unsupported": why}`` when
    the target lacks a type the kernel uses (not a defect of the kernel); else
    ``{"error": ...}`` with the compiler's first line and its cause."""
    if target.is_tpu:
        return _lower_tpu(spec, target)
    try:
        art = compile_artifacts(spec, target)
    except Exception as exc:  # a kernel that does not compile is a result, not a crash
        text = str(exc)
        m = _UNSUPPORTED.search(text)
        if m:
            why = f"{target.name} has no {m.group(1)}"
            has = [t.strip(" '\"") for t in (m.group(2) or "").split(",") if t.strip(" '\"")]
            return {"unsupported": f"{why} (it has {', '.join(has)})" if has else why}
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() != "^"]
        head = " … ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""
        return {"error": f"{type(exc).__name__}: {head}"[:500]}
    return {"facts": parse.parse(art), "triton": art["triton"]}


def _work(index: int) -> dict:
    spec, target = _JOBS[index]
    return compile_one(spec, target)


def _kill(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers now (a compile holds nothing that needs cleaning up; results
    are written by this process). Safe in a signal handler: takes none of the pool's locks."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            p.kill()
    for p in procs:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            p.join(2)


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def run(
    pairs: Sequence[tuple[Spec, Target]],
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Results for each pair, in order, each with ``cached`` (bool) added."""
    global _JOBS
    keys = [cache_key(s, t) for s, t in pairs]
    # A spec compiled in this process (TPU lowerings) is deduplicated by its own key, and its
    # cache entry read under the cache key.
    locals_ = {
        i: f"{keys[i]}:{s.local_key()}"
        for i, (s, _) in enumerate(pairs)
        if getattr(s, "in_process", False)
    }
    keys = [locals_.get(i, k) for i, k in enumerate(keys)]
    results: dict[str, dict] = {}
    todo: dict[str, int] = {}
    local: dict[str, int] = {}  # compiled in this process, never cached (TPU lowerings)
    for i, key in enumerate(keys):
        if key in results or key in todo or key in local:
            continue
        spec = pairs[i][0]
        store = key.split(":", 1)[0]
        hit = _read(store) if use_cache and getattr(spec, "cacheable", True) else None
        if hit is not None:
            results[key] = {**hit, "cached": True}
        elif getattr(spec, "in_process", False):
            local[key] = i
        else:
            todo[key] = i
    jobs = default_jobs() if jobs is None else max(1, jobs)
    if multiprocessing.current_process().daemon:  # a sweep's worker may not fork a pool
        jobs = 1
    done, total = 0, len(todo) + len(local)
    if progress:
        progress(done, total)
    fork_ok = "fork" in multiprocessing.get_all_start_methods()
    if jobs > 1 and len(todo) > 1 and fork_ok:
        _JOBS = [pairs[i] for i in todo.values()]
        pool = ProcessPoolExecutor(
            max_workers=min(jobs, len(todo)),
            mp_context=multiprocessing.get_context("fork"),
            initializer=_workers.in_worker,
        )
        try:
            with _workers.ending_with(lambda: _kill(pool)) as guard:
                # Futures of our own (not pool.map, which cancels them on an exception: a
                # cancelled future then breaks the pool's own clean-up on Python 3.11). The
                # first submit forks the workers.
                with guard.starting():
                    futures = [pool.submit(_work, i) for i in range(len(_JOBS))]
                for key, future in zip(todo, futures, strict=True):
                    data = future.result()
                    _write(key, data)
                    results[key] = {**data, "cached": False}
                    done += 1
                    if progress:
                        progress(done, total)
        except BaseException:
            pool.shutdown(wait=True)  # the workers are gone: quick
            raise
        finally:
            _JOBS = []
        pool.shutdown()
    else:
        for key, i in todo.items():
            data = compile_one(*pairs[i])
            _write(key, data)
            results[key] = {**data, "cached": False}
            done += 1
            if progress:
                progress(done, total)
    # After the forked workers are gone: jax starts threads, and a fork after that is unsafe.
    for key, i in local.items():
        data = compile_one(*pairs[i])
        _write(key.split(":", 1)[0], data)
        results[key] = {**data, "cached": False}
        done += 1
        if progress:
            progress(done, total)
    return [results[k] for k in keys]
