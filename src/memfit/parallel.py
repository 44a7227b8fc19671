"""Checking many files: in order, one process for now."""

from __future__ import annotations


def map_checked(paths: list[str], options, jobs: int = 0) -> list:
    from .runner import safe_check

    return [safe_check(path, options) for path in paths]
