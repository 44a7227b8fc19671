"""User patterns (lora.target_modules as a string, lora.modules_to_save, quantization.skip_modules):
valid regular expressions whose matching cost is bounded, or a positioned diagnostic.

peft matches a string `target_modules` as a regex against each module's whole name, and memfit
matches `modules_to_save` and `skip_modules` as transformers and peft do, as regexes inside a
module-boundary wrapper. Python's `re` backtracks, so a pattern such as `(.|.)*!` takes
exponential time on a module name of forty characters. A pattern is accepted when:

- it compiles (an invalid one is a diagnostic at the value, never an internal error);
- no repetition that can repeat more than once (`*`, `+`, `{2,}`...) contains another
  repetition (an optional `?` too), an alternation (`|`); and there is no back-reference: those
  are the shapes that backtrack exponentially (`(a+)*`, `(.|.)*`, `(a?){20}a{20}`);
- a counted repetition is at most MAX_COUNT (`(?:){99999999}` is 10^8 steps on any name);
- it has at most MAX_UNBOUNDED unbounded repetitions (each adds a factor of the name's length
  to the worst case) and at most MAX_LENGTH characters.

Module names are short (tens of characters) and the layer count is bounded (models/hf_config),
so an accepted pattern's worst case is a small polynomial in the name's length.
"""

from __future__ import annotations

import re

try:  # Python 3.11+
    from re import _constants as _c
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre  # type: ignore[no-redef]

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem

MAX_LENGTH = 256
MAX_UNBOUNDED = 3
MAX_COUNT = 256  # a{N}: each repetition is a step of the matcher, even of an empty group
_WIDE = 16  # a bounded repetition of more than this many counts as unbounded
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | ({_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set())


def pattern_problem(text: str) -> str | None:
    """Why `text` is not an acceptable module pattern, or None."""
    if len(text) > MAX_LENGTH:
        return f"is {len(text):,} characters long; a module pattern is at most {MAX_LENGTH}"
    try:
        tree = _sre.parse(text)
        re.compile(text)
    except re.error as error:
        where = f" at position {error.pos}" if error.pos is not None else ""
        return f"is not a valid regular expression: {error.msg}{where}"
    except (RecursionError, OverflowError, ValueError) as error:
        return f"is not a usable regular expression ({type(error).__name__})"
    state = {"unbounded": 0, "problem": None}
    _walk(tree, False, state)
    if state["problem"] is None and state["unbounded"] > MAX_UNBOUNDED:
        state["problem"] = f"has {state['unbounded']} unbounded repetitions; at most {MAX_UNBOUNDED} keep its matching time bounded"
    return state["problem"]


def _items(av):
    """The sub-patterns of one parsed item's argument."""
    if isinstance(av, _sre.SubPattern):
        yield av
    elif isinstance(av, (tuple, list)):
        for x in av:
            yield from _items(x)


def _walk(pattern, inside_repeat: bool, state: dict) -> None:
    for op, av in pattern:
        if state["problem"] is not None:
            return
        if op in _REPEATS:
            low, high, body = av
            many = high == _c.MAXREPEAT or high > 1
            if inside_repeat:  # an optional part too: (a?){20}a{20} backtracks 2^20 ways
                state["problem"] = "nests one repetition inside another (e.g. (a+)*): that backtracks exponentially; flatten it"
                return
            if low > MAX_COUNT or (high != _c.MAXREPEAT and high > MAX_COUNT):
                state["problem"] = f"repeats something up to {max(low, high if high != _c.MAXREPEAT else 0):,} times; a count is at most {MAX_COUNT}"
                return
            if high == _c.MAXREPEAT or high > _WIDE:
                state["unbounded"] += 1
            _walk(body, inside_repeat or many, state)
        elif op is _c.BRANCH:
            if inside_repeat:
                state["problem"] = "repeats an alternation (e.g. (a|b)*): that backtracks exponentially; use a character class or list the names"
                return
            for branch in av[1]:
                _walk(branch, inside_repeat, state)
        elif op in (_c.GROUPREF, getattr(_c, "GROUPREF_EXISTS", None)):
            state["problem"] = "uses a back-reference: module patterns may not"
            return
        else:
            for sub in _items(av):
                _walk(sub, inside_repeat, state)


def problems(data) -> list[Problem]:
    """Each unacceptable user pattern of a schema-valid document, at its value."""
    out: list[Problem] = []
    if not isinstance(data, dict):
        return out
    lora = data.get("lora")
    if isinstance(lora, dict):
        targets = lora.get("target_modules")
        if isinstance(targets, str) and targets != "all-linear":
            wrong = pattern_problem(targets)
            if wrong is not None:
                out.append(Problem(("lora", "target_modules"), codes.BAD_LORA, f"lora.target_modules {_short(targets)} {wrong}"))
        out += _listed(lora.get("modules_to_save"), ("lora", "modules_to_save"), codes.BAD_LORA)
    quantization = data.get("quantization")
    if isinstance(quantization, dict):
        out += _listed(quantization.get("skip_modules"), ("quantization", "skip_modules"), codes.SCHEMA)
    return out


def _listed(items, path: tuple, code: str) -> list[Problem]:
    out = []
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, str):
                wrong = pattern_problem(item)
                if wrong is not None:
                    out.append(Problem(path + (index,), code, f"{'.'.join(path)}[{index}] {_short(item)} {wrong}"))
    return out


def _short(text: str, limit: int = 40) -> str:
    shown = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(shown)
