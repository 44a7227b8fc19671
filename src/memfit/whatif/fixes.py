"""Fixes: the single changes that make an over-budget (or near-budget) config fit, cheapest in
training speed first, each with the total it leads to and the exact text edit.

A remedy is a table entry: when it applies to a config (the keys it needs exist in the schema,
the config allows it), it proposes a change to the data; the pipeline (check.evaluate) says
what the changed config needs, and only changes that make it fit are offered. Nothing here
computes bytes. Edits are minimal text edits at the node's range, so a config's formatting,
comments and key order are kept.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import field
from functools import lru_cache

from memfit.diagnostics import codes
from memfit.check.pipeline import Options, Result, check, evaluate
from memfit.diagnostics.diagnostic import Range
from memfit.diagnostics.records import record
from memfit.read import source
from memfit.read.native.edits import spelt
from memfit.read.native.llamafactory import v1_key
from memfit.recipe.costs import OPTIMIZER_STATES
from memfit.recipe.optim import OPTIMIZERS
from memfit.whatif.fit import CLEAR, OVER, Probe, gated, inline, largest, location, locations, read

FIXABLE = (codes.BUDGET_EXCEEDED, codes.NEAR_BUDGET)


@record(frozen=True)
class Edit:
    range: Range
    new_text: str

    def to_json(self) -> dict:
        return {"range": self.range.to_json(), "new_text": self.new_text}


@record(compiled_init=True)
class Fix:
    kind: str
    title: str
    total: int  # the figure the budget gate compares, after the change
    changes: list  # [(path, before or None, after)]
    edits: list = field(default_factory=list)
    speed: int = 0

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "title": self.title,
            "total": self.total,
            "changes": [{"key": ".".join(map(str, p)), "from": before, "to": after} for p, before, after in self.changes],
            "edits": [e.to_json() for e in self.edits],
        }


# --- the schema knows which keys exist -------------------------------------------------------


@lru_cache(maxsize=1)
def _schema() -> dict:
    from memfit.read.schema import schema

    return schema()


def _node(schema_node: dict) -> dict:
    ref = schema_node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _node(_schema()["$defs"][ref.rsplit("/", 1)[1]])
    return schema_node


def declared(path: tuple) -> dict | None:
    """The schema of the key at `path` when the config format has that key, else None."""
    node = _node(_schema())
    for part in path:
        properties = node.get("properties")
        if not isinstance(properties, dict) or part not in properties:
            return None
        node = _node(properties[part])
    return node


def _enum(path: tuple) -> list:
    node = declared(path) or {}
    return list(node.get("enum", ()))


# --- remedies: the table -------------------------------------------------------------------


def _get(data, path: tuple):
    node = data
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _micro_batch(data: dict, options: Options, refuse, result: Result, floor: bool = False) -> list[tuple]:
    """micro_batch down to the largest that fits, gradient_accumulation up to keep the global batch
    (`floor`: down to 1 even when 1 does not fit, to see how close that comes)."""
    key = location(data, "micro_batch")
    if key is None:
        return []
    current = read(data, key)
    both = locations(data, "micro_batch")  # spellings of one axis agree: all change together
    new = largest(Probe(data, both, options, refuse, result.path))
    if new == 0 and floor:
        new = 1
    if new == 0 or new >= current:
        return []
    changes = [(path, read(data, path), new) for path in both]
    accumulate = ("training", "gradient_accumulation")
    steps = _get(data, accumulate)
    # a config without a training section is not a run: adding one would change what the gate compares
    if steps is not None or (declared(accumulate) is not None and "training" in data):
        before = steps if steps is not None else 1
        after = math.ceil(current * before / new)
        if after != before:
            changes.append((accumulate, steps, after))
        ranks = _get(data, ("parallel", "data"))
        ranks = ranks if isinstance(ranks, int) and ranks > 0 else 1  # the global batch spans the data-parallel ranks
        title = f"micro_batch {current} → {new}, gradient_accumulation {before} → {after} (global batch {current * before * ranks} → {new * after * ranks})"
    else:
        title = f"micro_batch {current} → {new} (no gradient_accumulation key to keep the global batch: it shrinks)"
    return [(title, changes)]


def _eval_batch(data: dict, options: Options, refuse, result: Result) -> list[tuple]:
    """The evaluation pass's batch (training.eval_batch) down to the largest that fits: the training step is
    unchanged, evaluation runs on fewer sequences at a time."""
    path = ("training", "eval_batch")
    current = _get(data, path)
    if not isinstance(current, int) or isinstance(current, bool):
        return []
    new = largest(Probe(data, (path,), options, refuse, result.path))
    if new == 0 or new >= current:
        return []
    return [(f"eval_batch {current} → {new} (the evaluation pass on fewer sequences; the training step unchanged)", [(path, current, new)])]


def _set(path: tuple, value, title: str, *, when=None):
    """A remedy that sets one key to one value, where the schema has that key and value."""

    def propose(data, options, refuse, result):
        if declared(path) is None or (_enum(path) and value not in _enum(path)):
            return []
        if when is not None and not when(data):
            return []
        before = _get(data, path)
        if before == value:
            return []
        return [(title, [(path, before, value)])]

    return propose


def _next_zero(data, options, refuse, result):
    """The next ZeRO stage, when there are data-parallel ranks to shard over."""
    path = ("parallel", "zero")
    if declared(path) is None or not _data_parallel(data) or _get(data, ("parallel", "fsdp")) not in (None, "no_shard"):
        return []
    stage = _get(data, path) or 0
    if not isinstance(stage, int) or stage >= 3:
        return []
    return [(f"ZeRO stage {stage} → {stage + 1}", [(path, _get(data, path), stage + 1)])]


def _data_parallel(data) -> bool:
    ranks = _get(data, ("parallel", "data"))
    return isinstance(ranks, int) and ranks > 1


def _no_zero(data) -> bool:
    return _data_parallel(data) and not _get(data, ("parallel", "zero")) and _get(data, ("parallel", "fsdp")) in (None, "no_shard", "shard_grad_op")


# optimizer -> its 8-bit form (bitsandbytes' blockwise 8-bit state): the names memfit knows
EIGHT_BIT = {"adam": "adam8bit", "adamw": "adamw8bit", "lion": "lion8bit"}


def _eight_bit(data, options, refuse, result):
    name = data.get("optimizer")
    target = EIGHT_BIT.get(name.strip().lower()) if isinstance(name, str) else None
    if target is None or not _known_optimizer(target):
        return []
    return [(f"optimizer {name} → {target}", [(("optimizer",), name, target)])]


def _known_optimizer(name: str) -> bool:
    """In the seed's table or the recipes' (bitsandbytes' 8-bit optimizers live there); the
    pipeline still has the last word: a change it refuses is never offered."""
    return name in OPTIMIZER_STATES or name in OPTIMIZERS


def _offload(data, options, refuse, result):
    path = ("parallel", "offload", "optimizer")
    before = _get(data, path)
    if declared(path) is None or before not in (None, "none") or (_enum(path) and "cpu" not in _enum(path)):
        return []
    return [("offload the optimizer state to the CPU (parallel.offload.optimizer: cpu)", [(path, before, "cpu")])]


def _is_run(data) -> bool:
    """A config with a training section describes a run; adding one would change what the gate compares."""
    return isinstance(data.get("training"), dict)


@record(frozen=True)
class Remedy:
    kind: str
    speed: int  # rank by the training speed it costs, cheapest first
    propose: object  # (data, options, refuse, result) -> [(title, [(path, before, after)])]


# Ranked by what each costs in step time, from the published measurements the anchors cite:
# PyTorch's fused optimizer implementation is as fast as foreach or faster (torch.optim docs); an 8-bit optimizer runs its update in one fused kernel (bitsandbytes: same speed); ZeRO 1-2
# communicate what plain data parallelism does (ZeRO paper, sec. 7); a smaller micro-batch
# with more accumulation steps keeps the maths but uses the GPU less fully; selective
# recomputation redoes only the attention core (Korthikanti et al.: ~4% overhead); FSDP
# full_shard adds an all-gather per layer; full checkpointing runs the forward twice (~33%);
# CPU offload moves the state over PCIe every step.
REMEDIES: tuple[Remedy, ...] = (
    Remedy("eval_batch", 0, _eval_batch),  # evaluation's batch: no training step time
    Remedy("optimizer_impl", 0, _set(("training", "optimizer_impl"), "fused", "optimizer_impl: fused (one kernel per step: no foreach temporaries)", when=_is_run)),
    Remedy("optimizer_8bit", 0, _eight_bit),
    Remedy("zero", 1, _next_zero),
    Remedy("micro_batch", 2, _micro_batch),
    Remedy("checkpointing", 3, _set(("training", "checkpointing"), "selective", "checkpointing: selective (recompute the attention core)", when=_is_run)),
    Remedy("fsdp", 4, _set(("parallel", "fsdp"), "full_shard", "fsdp: full_shard", when=_no_zero)),
    Remedy("checkpointing", 5, _set(("training", "checkpointing"), "full", "checkpointing: full (recompute each layer in backward)", when=_is_run)),
    Remedy("offload", 6, _offload),
)


def refused(result: Result):
    """What the budget gate says about this result: the codes a fix must clear, or None."""
    found = {d.code for d in result.diagnostics}
    if codes.BUDGET_EXCEEDED in found:
        return OVER
    if codes.NEAR_BUDGET in found:
        return CLEAR
    return None


def apply(data: dict, changes) -> dict:
    """A copy of the data with the changes made (missing mappings are created)."""
    for path, _, value in changes:
        data = _with(data, path, value)
    return data


def _with(node, path: tuple, value):
    base = node if isinstance(node, dict) else {}
    head, rest = path[0], path[1:]
    return {**base, head: _with(base.get(head), rest, value) if rest else value}


MAX_CHANGES = 3  # a combination has at most this many remedies
SHOWN = 3  # combinations offered, cheapest first


@record(compiled_init=True)
class Closest:
    """When nothing fits: the valid change (single or combined) that came nearest, and by how much it misses."""

    title: str
    total: int
    budget: int
    changes: list
    searched: int = MAX_CHANGES  # combinations of up to this many changes were tried

    @property
    def over(self) -> int:
        return self.total - self.budget

    def to_json(self) -> dict:
        return {
            "title": self.title,
            "total": self.total,
            "budget": self.budget,
            "over": self.over,
            "changes": [{"key": ".".join(map(str, p)), "from": before, "to": after} for p, before, after in self.changes],
        }


def fixes(result: Result, text: str, options: Options = Options()) -> list[Fix]:
    """The fixes for a checked config (check()'s result on `text`), cheapest first; none when it fits.
    Single changes first; when none fits, combinations of up to MAX_CHANGES remedies of the table, the
    SHOWN cheapest. When nothing fits, `result.closest` says what came nearest."""
    refuse = refused(result)
    if refuse is None or result.data is None or result.config is None:
        return []
    found: list[Fix] = []
    seen: set = set()
    evaluated = inline(result.data, result.path)  # referenced files read once
    near = _Nearest(result.budget)
    useless: set = set()  # remedies the pipeline refuses alone: left out of combinations (one that changes
    # nothing alone stays in: the 8-bit optimizer matters once a fused step has removed foreach's temporaries)
    for remedy in REMEDIES:
        for title, changes in remedy.propose(evaluated, options, refuse, result):
            key = tuple((p, after) for p, _, after in changes)
            if key in seen:
                continue
            seen.add(key)
            after = evaluate(apply(evaluated, changes), options, result.path)
            if after.footprint is None or any(d.severity == codes.ERROR and d.code not in CLEAR for d in after.diagnostics):
                useless.add(remedy)
                continue  # the change is not valid here (the pipeline refuses it)
            if any(d.code in refuse for d in after.diagnostics):
                near.saw(title, after, changes)
                continue  # it does not make the config fit
            made = safe_edits(text, changes, result.data) if result.origins is None else native_edits(text, changes, result.origins, result.input_format)
            found.append(Fix(remedy.kind, title, gated(after), changes, made, remedy.speed))
    found.sort(key=lambda f: f.speed)
    if not found:
        found = _combined(result, text, evaluated, options, refuse, near, useless)
    result.closest = near.best if not found else None
    return found


class _Nearest:
    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.best: Closest | None = None

    def saw(self, title: str, after: Result, changes) -> None:
        total = gated(after)
        if total is None or self.budget is None:
            return
        if self.best is None or total < self.best.total:
            self.best = Closest(title, total, self.budget, list(changes))


def _cost(ranks) -> tuple:
    """A combination's cost: its dearest change first, then the next (ranks are an order, not amounts)."""
    return tuple(sorted(ranks, reverse=True))


def _combined(result: Result, text: str, evaluated: dict, options: Options, refuse, near: _Nearest, useless=frozenset()) -> list[Fix]:
    """Combinations of 2..MAX_CHANGES remedies, tried cheapest first: each remedy proposes on the data the
    previous ones changed (the micro-batch one last: the largest micro-batch that fits the changed config);
    a combination that touches one key twice, or contains one that already fits, is not tried, nor one
    with a remedy that alone was refused."""
    from itertools import combinations

    ranked = [r for r in REMEDIES if r not in useless]
    candidates = [c for size in range(2, MAX_CHANGES + 1) for c in combinations(range(len(ranked)), size)]
    candidates.sort(key=lambda c: (_cost(ranked[i].speed for i in c), c))
    found: list[Fix] = []
    fitting: list[set] = []
    for combo in candidates:
        if len(found) >= SHOWN:
            break
        if any(f <= set(combo) for f in fitting):
            continue  # a cheaper subset already fits
        order = sorted(combo, key=lambda i: ranked[i].kind == "micro_batch")  # the micro-batch search last
        data, changes, titles, ok = evaluated, [], [], True
        for i in order:
            if ranked[i].propose is _micro_batch:  # when nothing fits, micro-batch 1 shows how close the rest come
                proposed = _micro_batch(data, options, refuse, result, floor=True)
            else:
                proposed = ranked[i].propose(data, options, refuse, result)
            if not proposed:
                ok = False
                break
            title, more = proposed[0]
            if any(p == q for p, _, _ in more for q, _, _ in changes):
                ok = False
                break
            changes, titles = changes + list(more), titles + [title]
            data = apply(data, more)
        if not ok:
            continue
        after = evaluate(data, options, result.path)
        if after.footprint is None or any(d.severity == codes.ERROR and d.code not in CLEAR for d in after.diagnostics):
            continue
        title = " + ".join(titles)
        if any(d.code in refuse for d in after.diagnostics):
            near.saw(title, after, changes)
            continue
        originals = [(p, _get(result.data, p), value) for p, _, value in changes]  # `from` as the file has it
        made = edits(text, originals, result.data) if result.origins is None else native_edits(text, originals, result.origins, result.input_format)
        fix = Fix("+".join(ranked[i].kind for i in order), title, gated(after), originals, sorted(made, key=lambda e: (e.range.start_line, e.range.start_character)), max(ranked[i].speed for i in combo))
        if not _edits_fit(fix, text, result, options, refuse):
            continue
        fitting.append(set(combo))
        found.append(fix)
    return found


def _edits_fit(fix: Fix, text: str, result: Result, options: Options, refuse) -> bool:
    """The edits, applied to the text, give a config that passes: what the user will run."""
    after = check(apply_edits(text, fix.edits), result.path, options)
    return after.config is not None and not any(d.severity == codes.ERROR or d.code in refuse for d in after.diagnostics)


# --- text edits ----------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def scalar(value) -> str:
    """A value as a YAML scalar that reads back as the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
        return value
    return json.dumps(value)


def _block(path: tuple, value, indent: int) -> str:
    """`path: value` as nested block mappings, one line per level."""
    lines = []
    for depth, part in enumerate(path[:-1]):
        lines.append(" " * (indent + 2 * depth) + f"{part}:")
    lines.append(" " * (indent + 2 * (len(path) - 1)) + f"{path[-1]}: {scalar(value)}")
    return "\n".join(lines) + "\n"


def safe_edits(text: str, changes, data) -> list[Edit]:
    """edits(), verified: the edited text must load (no syntax error, no duplicate key) to exactly the
    data with the changes made. An edit that would break the YAML or change anything else (a value
    reached through an alias, a layout the edits do not know) is never offered: the fix then has no
    edits, and --suggest and the editor show its change in words only."""
    try:
        found = edits(text, changes, data)
    except Exception:  # noqa: BLE001 -- a layout the edit builder does not know: no edit, never a crash
        return []
    edited = apply_edits(text, found)
    loaded = source.load(edited)
    if loaded.data is None or loaded.diagnostics or loaded.data != apply(data, changes):
        return []
    if _is_json(text) and not _is_json(edited):  # a JSON file stays JSON (YAML would read more than JSON allows)
        return []
    return found


def _is_json(text: str) -> bool:
    """Whether the text is a JSON document (YAML reads a superset: an edit must keep a JSON file JSON)."""
    if not text.lstrip().startswith(("{", "[")):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _written(text: str, path: tuple) -> bool:
    """Whether the key at `path` is written in the text itself (not reached through a merge key or an alias)."""
    return path in source.keys_at(text, {path[:i] for i in range(len(path) + 1)})


def native_edits(text: str, changes, origins: dict, fmt: str | None = None) -> list[Edit]:
    """The edits of a fix in a native config, in the format's own keys (read/native/edits.py): a new value over
    the native key the memfit key came from (micro_batch_size for training.micro_batch in Axolotl), or the key
    added at the end of the file's top-level mapping where the file does not write it; a change the format has
    no spelling of (ZeRO, FSDP, offload: the DeepSpeed JSON's or the launch config's) gets none."""
    out = []
    if fmt == "llama-factory" and v1_key(source.load(text).data or {}) is not None:
        fmt = "llama-factory-v1"  # its own keys (read/native/edits.py)
    for path, before, value in changes:
        native = spelt(fmt, path, value)
        at = origins.get(path)
        if native is None:
            if at is None or at.file is not None or before is None or isinstance(value, bool) or not isinstance(value, int):
                continue
            where = source.locate(text, [(at.path, source.VALUE)])[(at.path, source.VALUE)]
            out.append(Edit(where, scalar(value)))
            continue
        key, new = native
        if at is not None and at.file is None and at.path == (key,):
            where = source.locate(text, [(at.path, source.VALUE)])[(at.path, source.VALUE)]
            out.append(Edit(where, scalar(new)))
        elif key in (source.load(text).data or {}):
            where = source.locate(text, [((key,), source.VALUE)])[((key,), source.VALUE)]
            out.append(Edit(where, scalar(new)))
        else:
            out.append(_append_top_level(text, key, new))
    return out


def _append_top_level(text: str, key: str, value) -> Edit:
    """`key: value` as a new last line of a block mapping at column 0 (a native config as frameworks write it)."""
    lines = _lines(text)
    last = len(lines) - 1
    while last > 0 and not lines[last].strip():
        last -= 1
    end = len(lines[last])
    return Edit(Range(last, end, last, end), f"\n{key}: {scalar(value)}")


def edits(text: str, changes, data=None) -> list[Edit]:
    """Minimal edits: a new value over the old value's range; a new key inserted into its
    nearest existing mapping (flow or block style, as that mapping is written). A key that a
    merge key (`<<: *defaults`) supplies is overridden by writing it into the mapping itself."""
    out = []
    for path, before, value in changes:
        if before is not None and _written(text, path):
            where = source.locate(text, [(path, source.VALUE)])[(path, source.VALUE)]
            out.append(Edit(where, json.dumps(value) if _is_json(text) else scalar(value)))
            continue
        if data is None:
            data = source.load(text).data
        out.append(_insert(text, data, path, value))
    return out


def _lines(text: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", text)  # the lines LSP counts, as the positions do


def _insert(text: str, data, path: tuple, value) -> Edit:
    """A new key inside its nearest existing mapping (data: the text's loaded data)."""
    depth = len(path) - 1
    while depth > 0 and not isinstance(_get(data, path[:depth]), dict):
        depth -= 1
    parent, rest = path[:depth], path[depth:]
    lines = _lines(text)
    if parent:
        found = source.locate(text, [(parent, source.VALUE)])
        where = found[(parent, source.VALUE)]
        line = lines[where.start_line]
        opening = _PROPERTIES.match(line, where.start_character).end()  # past an anchor (&name) or a tag (!tag)
        if line[opening : opening + 1] == "{":
            # flow mapping: before its closing brace, nested levels as flow mappings (in a JSON document, as JSON:
            # quoted keys, so the file stays JSON)
            spell = json.dumps if _is_json(text) else (lambda key: key)
            inner = json.dumps(value) if _is_json(text) else scalar(value)
            for part in reversed(rest[1:]):
                inner = f"{{{spell(part)}: {inner}}}"
            at = Range(where.end_line, where.end_character - 1, where.end_line, where.end_character - 1)
            last = _last_token(lines, where.start_line, where.end_line, where.end_character - 1)
            separator = "" if last in ("{", ",") else ", "  # `{a: 1, }`: its trailing comma separates already
            return Edit(at, f"{separator}{' ' if last == ',' else ''}{spell(rest[0])}: {inner}")
        first = next(iter(_get(data, parent)))
        key = source.locate(text, [(parent + (first,), source.KEY)])[(parent + (first,), source.KEY)]
        indent = key.start_character
        after = where.end_line + 1
    elif _is_json(text):
        # a JSON document's root mapping: the key before its closing brace, as JSON
        inner = json.dumps(value)
        for part in reversed(rest[1:]):
            inner = f"{{{json.dumps(part)}: {inner}}}"
        line = max(i for i, text_line in enumerate(lines) if "}" in text_line)
        character = lines[line].rindex("}")
        last = _last_token(lines, 0, line, character)
        return Edit(Range(line, character, line, character), f"{'' if last == '{' else ', '}{json.dumps(rest[0])}: {inner}")
    else:
        indent, after = 0, len(lines)
        if lines and lines[-1] == "":
            after -= 1
    at = Range(after, 0, after, 0)
    block = _block(rest, value, indent)
    if after >= len(lines) and lines and lines[-1] != "":
        block = "\n" + block  # the text has no final line break
        at = Range(len(lines) - 1, len(lines[-1]), len(lines) - 1, len(lines[-1]))
    return Edit(at, block)


def _last_token(lines: list[str], first: int, line: int, character: int) -> str:
    """The last character before (line, character) that is not blank or inside a comment, looking back
    over the lines of a flow mapping to its first line (`#` starts a comment after a blank or at a line's start)."""
    text = lines[line][:character]
    while True:
        code = _COMMENT.sub("", text).rstrip()
        if code or line <= first:
            return code[-1:] if code else ""
        line -= 1
        text = lines[line]


_PROPERTIES = re.compile(r"(?:[&!][^\s{}\[\],]*\s+)*")
_COMMENT = re.compile(r"(?:^|(?<=\s))#.*$")


def apply_edits(text: str, found: list[Edit]) -> str:
    """The text with the edits made (positions are of the original text, as in LSP)."""
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]

    def offset(line: int, character: int) -> int:
        return starts[line] + character if line < len(starts) else len(text)

    for edit in sorted(found, key=lambda e: (e.range.start_line, e.range.start_character), reverse=True):
        r = edit.range
        text = text[: offset(r.start_line, r.start_character)] + edit.new_text + text[offset(r.end_line, r.end_character) :]
    return text
