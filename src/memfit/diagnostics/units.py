"""Byte quantities in ("24 GiB", "10%") and out (exact ints shown in human units)."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from memfit.diagnostics.safe_text import echo

UNITS: dict[str, int] = {
    "B": 1,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_BY_FOLDED = {name.lower(): name for name in UNITS}

# The grammar as JSON Schema patterns (ECMA 262), for editors: a number, then a known unit.
BYTES_PATTERN = r"^\s*([0-9]+(\.[0-9]+)?|\.[0-9]+)\s*(" + "|".join(UNITS) + r")\s*$"
PERCENT_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*%\s*$"
# Read more leniently (any letters): a wrong unit gets a message that names the right one.
_QUANTITY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([A-Za-z]+)\s*\Z")
_PERCENT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*\Z")


class UnitError(ValueError):
    """A byte quantity that cannot be read; the message says why, for people."""


# Decimal and Fraction read any number of digits, in time that grows with the square of their
# count: a million-digit size took 33 s. Past Python's own int limit a size is refused at once.
MAX_DIGITS = 4300


def _q(value: object) -> str:
    """A value quoted back in a message: short, and with no character a terminal acts on."""
    return f"'{echo(value)}'" if isinstance(value, str) else echo(value)


def _number(text: str, value: object) -> Fraction:
    if len(text) > MAX_DIGITS:
        raise UnitError(f"{_q(value)} has a number of {len(text):,} digits; memfit reads at most {MAX_DIGITS:,}")
    return Fraction(Decimal(text))


def _unit(name: str) -> int:
    if name in UNITS:
        return UNITS[name]
    folded = name.lower()
    if folded == "kb":
        raise UnitError(f"unit {_q(name)} is ambiguous: write kB (1000 bytes) or KiB (1024 bytes)")
    if folded in _BY_FOLDED:
        raise UnitError(f"unknown unit {_q(name)}; did you mean {_BY_FOLDED[folded]}?")
    guess = _BY_FOLDED.get(folded + "ib") or _BY_FOLDED.get(folded + "b")
    hint = f"; did you mean {guess}?" if guess else ""
    raise UnitError(f"unknown unit {_q(name)}{hint} (known: {', '.join(UNITS)})")


def parse_bytes(value: object) -> int:
    """An int byte count, or '<number> <unit>' that is a whole number of bytes."""
    if isinstance(value, bool):
        raise UnitError(f"{_q(value)} is not a byte quantity")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"{value} is negative; a byte quantity must be >= 0")
        return value
    if not isinstance(value, str):
        raise UnitError(f"{_q(value)} is not a byte quantity; write an integer byte count or e.g. '24 GiB'")
    text = value.strip()
    if text.startswith("-"):
        raise UnitError(f"{_q(value)} is negative; a byte quantity must be >= 0")
    match = _QUANTITY.match(text)
    if not match:
        raise UnitError(f"{_q(value)} is not a byte quantity; write '<number> <unit>' such as '24 GiB' or '80GB'")
    number, unit = match.groups()
    exact = _number(number, value) * _unit(unit)
    if exact.denominator != 1:
        raise UnitError(f"{_q(value)} is not a whole number of bytes ({_approx(exact)} B)")
    return exact.numerator


def parse_reserve(value: object, memory: int | None) -> int:
    """A reserve: bytes, a unit string, or a percentage of memory (rounded up: never overstate the budget)."""
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if match:
            share = _number(match.group(1), value)
            if share > 100:
                raise UnitError(f"{_q(value)} is more than 100%")
            if memory is None:
                raise UnitError(f"{_q(value)} is a percentage, but there is no device.memory to take it of")
            amount = share * memory / 100
            return -(-amount.numerator // amount.denominator)
    return parse_bytes(value)


def parse_percent(value: object) -> Fraction:
    """'90%' -> Fraction(9, 10). The sign is required: '0.9' could mean 0.9% or 90%."""
    match = _PERCENT.match(value) if isinstance(value, str) else None
    if not match:
        raise UnitError(f"{_q(value)} is not a percentage; write it with a % sign, e.g. '90%'")
    share = _number(match.group(1), value)
    if share > 100:
        raise UnitError(f"{_q(value)} must be between 0% and 100%")
    return share / 100


def _approx(exact: Fraction) -> str:
    try:
        return repr(float(exact))
    except OverflowError:  # past a float's range: the whole part, shortened
        return echo(exact.numerator // exact.denominator)


def human(n: int) -> str:
    """An exact byte count in binary units for reading, e.g. 25769803776 -> '24.00 GiB'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for name in ("TiB", "GiB", "MiB", "KiB"):
        size = UNITS[name]
        if n >= size:
            # integer arithmetic, rounded half up at 2 decimals: no float for huge counts
            hundredths = (n * 100 + size // 2) // size
            return f"{sign}{hundredths // 100:,}.{hundredths % 100:02d} {name}"
    return f"{sign}{n} B"


def with_bytes(n: int) -> str:
    """'25,769,803,776 B (24.00 GiB)': exact count and a readable one."""
    if abs(n) < 1024:
        return f"{n} B"
    return f"{n:,} B ({human(n)})"
