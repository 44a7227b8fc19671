"""Work bounded by counting, not by the clock: the Python function calls (and calls into C) a piece of code makes,
the same on every machine, where a wall-clock limit passes on a fast one and fails on a slow or busy one."""

from __future__ import annotations

import sys


def calls(fn, *args, **kwargs):
    """(fn's result, the number of function calls it made: Python and C)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return result, count
