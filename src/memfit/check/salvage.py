"""Every problem at once: a config with schema errors still gets the diagnostics its valid parts allow.

The schema's problems stop the pipeline (a config the schema rejects has no footprint). Its other
problems would then arrive one edit later: an unknown optimizer, an unknown or ambiguous device preset, a
parallel layout that cannot work. Here the parts the schema rejected are cut out of the data (each
problem's node, or the key holding the list it is in: cutting a list item would move the items after it,
and the positions with them), and the config stage runs on what is left. Only problems of independent
meaning are kept (SEMANTIC), at paths the cut did not touch; nothing about the footprint or the budget is
reported for a config the schema rejected.
"""

from __future__ import annotations

from memfit.diagnostics import codes

# What the config stage finds that does not depend on the parts cut out (each a problem of its own key).
SEMANTIC = frozenset(
    {
        codes.UNKNOWN_OPTIMIZER,
        codes.UNKNOWN_DTYPE,
        codes.UNKNOWN_PRECISION,
        codes.UNKNOWN_PRESET,
        codes.UNKNOWN_QUANTIZATION,
        codes.BAD_UNIT,
        codes.BAD_LORA,
        codes.BAD_PARALLEL,
        codes.MASTER_WEIGHTS_NOOP,
        codes.PRESET_OVERRIDDEN,
    }
)
ROUNDS = 4  # cutting a node can leave a mapping without a required key: cut again, a few times


def _cut_path(path: tuple) -> tuple:
    """The node to cut for a schema problem at `path`: the path up to the first list index."""
    for i, part in enumerate(path):
        if isinstance(part, int):
            return tuple(path[:i])
    return tuple(path)


def _without(data, path: tuple):
    """A copy of `data` without the key at `path` (the mappings along it copied, nothing mutated)."""
    if not isinstance(data, dict) or not path or path[0] not in data:
        return data
    if len(path) == 1:
        return {k: v for k, v in data.items() if k != path[0]}
    return {**data, path[0]: _without(data[path[0]], path[1:])}


def _under(path: tuple, cuts: set) -> bool:
    return any(tuple(path[: len(cut)]) == cut or tuple(cut[: len(path)]) == tuple(path) for cut in cuts)


def salvage(data: dict, schema_problems: list, layout=None) -> list:
    """The semantic problems of the parts of `data` the schema accepts. `layout(config, data)` gives the
    parallel layout's problems (the pipeline's own check)."""
    from memfit.check.configure import configure
    from memfit.read import schema

    cuts: set = set()
    found = schema_problems
    for _ in range(ROUNDS):
        new = {_cut_path(tuple(p.path)) for p in found} - cuts
        if not new or () in new:
            return []  # a problem of the whole document: nothing is left to check
        for cut in new:
            data = _without(data, cut)
        cuts |= new
        found = schema.problems(data)
        if not found:
            break
    else:
        return []
    try:
        config, problems = configure(data)
        if "lora" in data or "quantization" in data:
            from memfit.recipe import adapters

            problems = problems + adapters.problems(data)
        if layout is not None and getattr(config, "parallel", None) is not None:
            problems = problems + layout(config, data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):  # what is left may still be odd:
        return []  # the schema's problems stand alone then (a bug elsewhere, a NameError, is not hidden here)
    return [p for p in problems if p.code in SEMANTIC and not _under(tuple(p.path), cuts)]
