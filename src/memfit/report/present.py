"""Presentation helpers shared by explain, the editor features and the model summaries:
shape text, truncation to a width, shares of a whole, the budget bar."""

from __future__ import annotations

from fractions import Fraction

from memfit.diagnostics.safe_text import ELLIPSIS, cut, shape_text  # noqa: F401  (shared with the models' messages)


def pct(part: int, whole: int) -> str:
    """A share to one decimal, rounded half up with integers ("-" of nothing)."""
    if not whole:
        return "-"
    tenths = (part * 1000 + whole // 2) // whole
    return f"{tenths // 10}.{tenths % 10}%"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def bar(used: int, budget: int, width: int, colour: bool, warn_at: Fraction = Fraction(9, 10)) -> str:
    """[####....] filled by used/budget (rounded up); red over the budget, yellow above the warning mark."""
    filled = min(width, (used * width + budget - 1) // budget) if budget else width
    over = used > budget
    text = "#" * filled + "." * (width - filled)
    if colour:
        code = "31" if over else "33" if used > warn_at * budget else "32"
        text = f"\x1b[{code}m{text}\x1b[0m"
    return f"[{text}]"
