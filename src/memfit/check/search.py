"""The exact search `memfit fit` runs: the largest value of one key for which a config fits, assuming the figure is
monotone in it (a guess from the first two points, exact where the figure is affine in the key, then galloping and
bisection: O(log n) pipeline runs). It runs on a probe (`fits(value)`, `bytes(value)`, `result(1).budget`) and imports
nothing, so that the pipeline can answer with it too (a sequence length left to the data: the longest that fits) and
`memfit fit` gives the same answer (whatif/fit.py Probe)."""

from __future__ import annotations

CEILING = 1 << 62  # no footprint stays under a budget this far out; the search stops here


class NoEffect(Exception):
    """The key does not change the footprint."""


def largest(probe) -> int:
    """The largest value >= 1 that fits (0 when 1 does not), exactly, assuming monotonicity."""
    if not probe.fits(1):
        return 0
    if probe.bytes(2) == probe.bytes(1):
        if probe.fits(CEILING):
            raise NoEffect
    if not probe.fits(2):
        return 1
    low, high = 2, None  # low fits; high (when known) does not
    budget = probe.result(1).budget
    slope = probe.bytes(2) - probe.bytes(1)
    if slope > 0:
        guess = (budget - (probe.bytes(1) - slope)) // slope  # exact when bytes are affine in the value
        guess = min(max(guess, low), CEILING)
        if guess > low:
            if not probe.fits(guess):
                high = guess
                # far off: the figure bends away from the first two points' line (attention's square in seq_len;
                # or the peak at 1 and 2 was another phase's, the optimizer step's, and the backward's line only
                # takes over further out). The line through `low` and the failed guess, once: under a curve that
                # bends up it fits and the doubling below starts there instead of at 2 (the 70B-size transformer's
                # micro_batch: 13 runs -> 7)
                second = _through(probe, low, high, budget)
                if second is not None:
                    if probe.fits(second):
                        low = second
                    else:
                        high = second
                # then double from below
                while low * 2 < high:
                    if not probe.fits(low * 2):
                        high = low * 2
                        break
                    low *= 2
            elif guess == CEILING or not probe.fits(guess + 1):
                return guess
            else:
                low = guess + 1
    step = 1
    while high is None:  # gallop up from the last value that fits
        candidate = min(low + step, CEILING)
        if probe.fits(candidate):
            low = candidate
            if low == CEILING:
                return low
            step *= 2
        else:
            high = candidate
    return _narrow(probe, low, high, budget)


def _through(probe, low: int, high: int, budget: int) -> int | None:
    """Where the line through (low, bytes) and (high, bytes) meets the budget, strictly inside the bracket; None
    where it does not fall inside or a figure is missing."""
    below, above = probe.bytes(low), probe.bytes(high)
    if below is None or above is None or above <= below:
        return None
    at = low + (budget - below) * (high - low) // (above - below)
    return at if low < at < high else None


def _narrow(probe, low: int, high: int, budget: int) -> int:
    """The boundary between low (fits) and high (does not): interpolation on the byte counts
    where it halves the bracket (a smooth curve: a few runs), bisection where it does not."""
    interpolate = True
    while high - low > 1:
        width = high - low
        below, above = probe.bytes(low), probe.bytes(high)
        if interpolate and below is not None and above is not None and above > below:
            middle = min(max(low + (budget - below) * width // (above - below), low + 1), high - 1)
        else:
            middle = (low + high) // 2
        if probe.fits(middle):
            low = middle
            if middle + 1 < high and not probe.fits(middle + 1):  # interpolation lands just short
                return middle
        else:
            high = middle
        interpolate = (high - low) * 2 <= width
    return low
