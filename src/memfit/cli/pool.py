"""Checking many files: results in input order, across cores when there are enough files to pay
for the workers.

A typical config checks in about a millisecond and a forked worker costs a few, so a pool only
starts from MIN_FILES_PER_JOB files per worker on; --jobs N asks for N anyway. memfit's pre-commit
hook is require_serial (one memfit gets every staged file), so this is its parallelism; a hook
that lets pre-commit split the files gets one pool per share only when each share is that large.
"""

from __future__ import annotations

from dataclasses import replace

import os
import sys

from memfit.check.pipeline import safe_check

MIN_FILES_PER_JOB = 50
CHUNKS_PER_JOB = 4  # contiguous chunks, several per worker, so one slow file does not idle the rest


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def jobs_for(files: int, jobs: int = 0) -> int:
    """Worker processes for `files` files: `jobs` if given (>= 1), else by file count and cores."""
    if jobs >= 1:
        return max(1, min(jobs, files))
    return max(1, min(cores(), files // MIN_FILES_PER_JOB))


def map_checked(paths: list[str], options, jobs: int = 0) -> list:
    """safe_check for each path, in order. Pooled results carry what the reporters read (path,
    diagnostics, footprint, budget, skipped), not the per-tensor rows or the raw data: sending
    those back would cost more than checking the file."""
    workers = jobs_for(len(paths), jobs)
    if workers <= 1:
        return [safe_check(path, options) for path in paths]

    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    # the first file is checked here: the modules a check imports on demand and the schema sections it compiles on
    # first use are then inherited by every forked worker, not imported and compiled again in each
    first, rest = safe_check(paths[0], options), paths[1:]
    size = -(-len(rest) // (workers * CHUNKS_PER_JOB))
    chunks = [rest[i : i + size] for i in range(0, len(rest), size)]
    # fork: the worker starts with memfit (and the compiled schema) already imported
    context = get_context("fork" if sys.platform == "linux" else None)
    try:
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return [first] + [result for chunk in pool.map(_check_chunk, chunks, [options] * len(chunks)) for result in chunk]
    except BrokenProcessPool:  # a worker died (killed, out of memory): check here instead
        return [first] + [safe_check(path, options) for path in rest]


def _check_chunk(paths: list[str], options) -> list:
    results = []
    for path in paths:
        result = safe_check(path, options)
        result.data = None
        if result.config is not None:  # what the parent prints needs neither: less to send back
            result.config = replace(result.config, tensors=(), layers=())
        results.append(result)
    return results
