"""A declared Keras-style layer stack (`model:`) -> weight tensors, saved activations, rows.

Semantics are Keras 3's (shapes, defaults, weight layout, trainable or not). Every layer type
is ONE entry in RULES: how it maps the incoming shape, which weights it owns, which tensors
PyTorch's eager autograd keeps for its backward in training mode (measured with
torch.autograd.graph.saved_tensors_hooks; see tests/models/test_frameworks.py and the README), and
its arguments with their defaults, from which the JSON Schema is generated (schemagen.py).
Adding a layer is one entry here plus its cross-check there.

Saved activations are counted as distinct tensors: a ReLU's output that the next Dense
keeps as its input is one tensor, counted once, on the first layer that keeps it. Views
(Flatten, Reshape, Dropout(0), a linear Activation) are the same tensor as their input.
The model's final output is kept by the loss, so it is counted too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from memfit.diagnostics import codes
from memfit.config.build import Emitted, Tensor, make_tensor, width
from memfit.diagnostics.diagnostic import Problem
from memfit.diagnostics.safe_text import shape_text

INT64, BOOL, FLOAT32 = "int64", "bool", "float32"


@dataclass(slots=True)
class LayerRow:
    """One layer as `explain` and the language server show it (plain fields, no logic)."""

    index: int  # position in model.layers
    path: tuple  # ("model", "layers", index): where the layer is declared
    type: str  # the layer type as written, e.g. "Conv2D"
    name: str  # Keras's name: "conv2d", "conv2d_1", ... or the layer's own `name`
    output_shape: list  # batch axis included, e.g. [32, 20, 20, 32]
    params: int  # elements of all its weights (Keras's "Param #")
    trainable: list = field(default_factory=list)  # [(weight name, shape)], e.g. ("conv2d/kernel", [8, 8, 4, 32])
    non_trainable: list = field(default_factory=list)  # [(weight name, shape)]: BatchNormalization moving stats
    saved_bytes: int = 0  # bytes of activations first kept for backward by this layer
    saved: list = field(default_factory=list)  # [(label, shape, dtype)] of those tensors; dtype None = dtypes.activations


class Mismatch(Exception):
    """The layer cannot take the incoming shape; the message says why."""


# --- saved-tensor specs -------------------------------------------------------------
# ("in",): the incoming tensor; ("out",): the layer's output; ("ids",): the incoming
# tensor as int64 ids (a cast copy unless it already is); (label, shape, dtype): a tensor
# of its own (dtype None = the activations dtype).
IN, OUT, IDS = ("in",), ("out",), ("ids",)


def _new(label: str, shape, dtype: str | None = None) -> tuple:
    return (label, list(shape), dtype)


# Activation name -> which tensor its backward keeps (None: identity, nothing).
# Measured per function in tests/models/test_frameworks.py against torch.
ACTIVATIONS: dict[str, tuple | None] = {
    "linear": None,
    "relu": OUT,
    "relu6": IN,
    "sigmoid": OUT,
    "tanh": OUT,
    "softmax": OUT,
    "log_softmax": OUT,
    "exponential": OUT,
    "gelu": IN,
    "silu": IN,
    "swish": IN,
    "elu": IN,
    "selu": IN,
    "softplus": IN,
    "leaky_relu": IN,
    "mish": IN,
    "hard_sigmoid": IN,
}


# --- shape helpers ------------------------------------------------------------------
def _shape_text(shape) -> str:
    return shape_text(shape, "()")


def _tuple(value, n: int, what: str) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    if len(value) != n:
        raise Mismatch(f"{what} has {len(value)} values; this layer needs {n} (one per spatial axis)")
    return list(value)


def _rank(shape, rank: int, layout: str) -> None:
    if len(shape) != rank:
        raise Mismatch(f"it needs a rank-{rank} input {layout}, not rank {len(shape)}")


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial axes of a channels-last tensor."""

    out: list  # output spatial sizes
    padded: list | None  # the padded input's shape when 'same' needs an asymmetric pad (a copy), else None


LAYOUTS = {1: "(batch, steps, channels)", 2: "(batch, height, width, channels)", 3: "(batch, depth, height, width, channels)"}


def _window(shape, n: int, kernel, strides, dilation, padding: str, what: str = "kernel") -> Window:
    _rank(shape, n + 2, LAYOUTS[n])
    k = _tuple(kernel, n, f"{what}_size" if what == "kernel" else "pool_size")
    s = _tuple(strides, n, "strides")
    d = _tuple(dilation, n, "dilation_rate")
    if max(s) > 1 and max(d) > 1:
        raise Mismatch("Keras does not allow strides > 1 together with dilation_rate > 1")
    sizes, pads = [], []
    for axis, (size, kk, ss, dd) in enumerate(zip(shape[1:-1], k, s, d), start=1):
        span = dd * (kk - 1) + 1
        if padding == "valid":
            if size < span:
                grown = f" (dilated to {span})" if dd > 1 else ""
                raise Mismatch(f"its {what} {kk}{grown} is larger than axis {axis} ({size}) under padding 'valid': the output would be empty")
            out = (size - span) // ss + 1
        else:
            out = -(-size // ss)
        sizes.append(out)
        pads.append(max((out - 1) * ss + span - size, 0))
    # PyTorch pads symmetrically inside the kernel; an odd total needs F.pad: a padded copy is what is kept
    padded = None
    if padding == "same" and any(p % 2 for p in pads):
        padded = [shape[0], *(size + p for size, p in zip(shape[1:-1], pads)), shape[-1]]
    return Window(sizes, padded)


def _kept_input(window: Window) -> tuple:
    return IN if window.padded is None else _new("padded input", window.padded)


# --- per-type rules ---------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    shape: Callable  # (params, in_shape) -> out_shape; raises Mismatch
    weights: Callable = lambda p, s: []  # (params, in_shape) -> [(name, shape, trainable)]
    saved: Callable = lambda p, s, o: []  # (params, in_shape, out_shape) -> [spec]: what backward keeps
    view: Callable = lambda p: False  # the output is the same tensor as the input (no copy)
    activation: bool = False  # takes an `activation` argument applied to its output
    inner: tuple = ()  # automatic names Keras's own sublayers take (they advance the same counters)
    doc: str = ""  # the schema's description of the layer type
    args: dict = field(default_factory=dict)  # argument -> its JSON Schema (title, description, default: editors show them)
    required: tuple = ()  # arguments without a default
    merge: tuple | None = None  # (fewest, most or None) inputs: a merge layer's callables take a LIST of shapes


def _bias(p, shape) -> list:
    return [("bias", shape, True)] if p["use_bias"] else []


def _conv(n: int) -> Rule:
    def window(p, s):
        return _window(s, n, p["kernel_size"], p["strides"], p["dilation_rate"], p["padding"])

    def shape(p, s):
        if s[-1] % p["groups"]:
            raise Mismatch(f"its {s[-1]} input channels are not divisible by groups={p['groups']}")
        if p["filters"] % p["groups"]:
            raise Mismatch(f"filters={p['filters']} is not divisible by groups={p['groups']}")
        return [s[0], *window(p, s).out, p["filters"]]

    def weights(p, s):
        k = _tuple(p["kernel_size"], n, "kernel_size")
        return [("kernel", [*k, s[-1] // p["groups"], p["filters"]], True), *_bias(p, [p["filters"]])]

    return Rule(shape, weights, lambda p, s, o: [_kept_input(window(p, s))], activation=True)


def _depthwise_window(p, s):
    return _window(s, 2, p["kernel_size"], p["strides"], p["dilation_rate"], p["padding"])


def _depthwise_shape(p, s):
    return [s[0], *_depthwise_window(p, s).out, s[-1] * p["depth_multiplier"]]


def _separable_shape(p, s):
    return [s[0], *_depthwise_window(p, s).out, p["filters"]]


def _separable_weights(p, s):
    k = _tuple(p["kernel_size"], 2, "kernel_size")
    middle = s[-1] * p["depth_multiplier"]
    return [
        ("depthwise_kernel", [*k, s[-1], p["depth_multiplier"]], True),
        ("pointwise_kernel", [1, 1, middle, p["filters"]], True),
        *_bias(p, [p["filters"]]),
    ]


def _pool(n: int, keep_indices: bool) -> Rule:
    def window(p, s):
        strides = p["strides"] if p.get("strides") is not None else p["pool_size"]
        return _window(s, n, p["pool_size"], strides, 1, p["padding"], what="pool")

    def saved(p, s, o):
        kept = [_kept_input(window(p, s))]
        return kept + [_new("indices", o, INT64)] if keep_indices else kept

    return Rule(lambda p, s: [s[0], *window(p, s).out, s[-1]], saved=saved)


def _global(n: int, keep: list) -> Rule:
    def shape(p, s):
        _rank(s, n + 2, LAYOUTS[n])
        return [s[0], s[-1]]

    return Rule(shape, saved=lambda p, s, o: list(keep))


def _reshape(p, s):
    target = list(p["target_shape"])
    size = math.prod(s[1:])
    if 0 in target:
        raise Mismatch("target_shape has a 0; every dim must be positive (or one -1)")
    if target.count(-1) > 1:
        raise Mismatch("target_shape has more than one -1; only one dim can be inferred")
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        if size % known:
            raise Mismatch(f"{size} elements per sample cannot be split into {_shape_text(target)}: {size} is not a multiple of {known}")
        target[target.index(-1)] = size // known
    elif known != size:
        raise Mismatch(f"target_shape {_shape_text(target)} holds {known} elements per sample, the input has {size}")
    return [s[0], *target]


def _norm_weights(p, s, moving: bool) -> list:
    c = [s[-1]]
    out = ([("gamma", c, True)] if p["scale"] else []) + ([("beta", c, True)] if p["center"] else [])
    return out + ([("moving_mean", c, False), ("moving_variance", c, False)] if moving else [])


def _rnn_shape(p, s):
    _rank(s, 3, "(batch, timesteps, features)")
    return [s[0], s[1], p["units"]] if p["return_sequences"] else [s[0], p["units"]]


def _rnn_weights(cell: str, gates: int):
    def weights(p, s):
        u = p["units"]
        bias = [u * gates] if cell != "gru_cell" or not p["reset_after"] else [2, u * gates]
        out = [(f"{cell}/kernel", [s[-1], u * gates], True), (f"{cell}/recurrent_kernel", [u, u * gates], True)]
        return out + ([(f"{cell}/bias", bias, True)] if p["use_bias"] else [])

    return weights


def _rnn_saved(gates: int, per_step: int):
    """PyTorch's native (unfused) cell loop: the input once (its projection is one matmul),
    then per timestep the gate pre-activations and `per_step` state-sized tensors.
    SimpleRNN (gates=0) keeps the hidden states h0..hT."""

    def saved(p, s, o):
        b, t, u = s[0], s[1], p["units"]
        if not gates:
            return [IN, _new("hidden states", [t + 1, b, u])]
        return [IN, _new("gates", [t, b, gates * u]), _new("cell states", [t, b, per_step * u])]

    return saved


def _mha_dims(p, s):
    _rank(s, 3, "(batch, sequence, features)")
    return s[0], s[1], p["num_heads"], p["key_dim"], p["value_dim"] or p["key_dim"]


def _mha_shape(p, s):
    _mha_dims(p, s)
    return list(s)  # self-attention; Keras's output_shape defaults to the query's last axis


def _mha_weights(p, s):
    _, _, h, dk, dv = _mha_dims(p, s)
    d = s[-1]
    out = []
    for part, dim in (("query", dk), ("key", dk), ("value", dv)):
        out.append((f"{part}/kernel", [d, h, dim], True))
        if p["use_bias"]:
            out.append((f"{part}/bias", [h, dim], True))
    out.append(("attention_output/kernel", [h, dv, d], True))
    return out + ([("attention_output/bias", [d], True)] if p["use_bias"] else [])


def _mha_saved(p, s, o):
    """Keras runs fused dot-product attention when dropout is 0 (PyTorch's SDPA: flash on
    CPU and CUDA keeps q, k, v, the output and a float32 logsumexp), and the explicit
    softmax(QK^T)V otherwise. PyTorch's CPU flash kernel needs key_dim == value_dim;
    otherwise SDPA falls back to the math path, which keeps the attention weights."""
    b, t, h, dk, dv = _mha_dims(p, s)
    kept = [IN, _new("query", [b, h, t, dk]), _new("key", [b, h, t, dk]), _new("value", [b, h, t, dv])]
    scores = [b, h, t, t]
    if p["dropout"] > 0:
        kept += [_new("attention weights", scores), _new("dropout mask", scores, BOOL), _new("dropped weights", scores)]
    elif dk == dv:
        kept.append(_new("logsumexp", [b, h, t], FLOAT32))
    else:
        kept.append(_new("attention weights", scores))
    return kept + [_new("context", [b, t, h * dv])]



def _zero_pad(p) -> list[list[int]]:
    """Keras's ZeroPadding2D padding: int, (rows, cols) or ((top, bottom), (left, right))."""
    pad = p["padding"]
    if isinstance(pad, int):
        return [[pad, pad], [pad, pad]]
    return [[v, v] if isinstance(v, int) else list(v) for v in pad]


def _zero_pad_shape(p, s):
    _rank(s, 4, LAYOUTS[2])
    (top, bottom), (left, right) = _zero_pad(p)
    return [s[0], s[1] + top + bottom, s[2] + left + right, s[3]]


# --- merge layers: several inputs (keras.layers.Add, Concatenate, ...) ------------------
def _inputs_text(shapes) -> str:
    return ", ".join(_shape_text(s) for s in shapes)


def _elementwise_shape(p, shapes):
    """Keras's Merge._compute_elemwise_op_output_shape on inputs of one rank: per axis equal,
    or one of them 1 (broadcast)."""
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        raise Mismatch(f"its inputs have different ranks: {_inputs_text(shapes)}")
    out = list(shapes[0])
    for other in shapes[1:]:
        for axis, (a, b) in enumerate(zip(out, other)):
            if a != b and 1 not in (a, b):
                raise Mismatch(f"axis {axis} is {a} in one and {b} in another (equal sizes, or 1 to broadcast)")
            out[axis] = max(a, b) if 1 in (a, b) else a
    return out


def _chain_saved(p, shapes, out):
    """multiply / maximum / minimum as Keras chains them (out = op(out, x_i)): torch's backward of
    each binary op keeps both operands, so every input and every intermediate result is kept."""
    kept = [("in", 0)]
    partial = list(shapes[0])
    for k, shape in enumerate(shapes[1:], start=1):
        if k > 1:
            kept.append(_new(f"partial result {k}", partial))
        kept.append(("in", k))
        partial = [max(a, b) for a, b in zip(partial, shape)]
    return kept


def _concat_shape(p, shapes):
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        raise Mismatch(f"its inputs have different ranks: {_inputs_text(shapes)}")
    rank = ranks.pop()
    axis = p["axis"] + rank if p["axis"] < 0 else p["axis"]
    if not 1 <= axis < rank:
        raise Mismatch(f"axis {p['axis']} is not a non-batch axis of its rank-{rank} inputs")
    for other in shapes[1:]:
        for a, (x, y) in enumerate(zip(shapes[0], other)):
            if a != axis and x != y:
                raise Mismatch(f"axis {a} is {x} in one and {y} in another; only the concatenation axis {axis} may differ")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return out


MERGE_DOC = "Takes the tensors named in `inputs` (at least 2), all of one shape (an axis of size 1 broadcasts)"


def _merge(shape, saved, fewest: int = 2, most: int | None = None) -> Rule:
    return Rule(shape, saved=saved, merge=(fewest, most))


# --- argument specs: what the schema says of each argument (the defaults are read from here) ---
def _ints(n: int, nullable: bool = False) -> list:
    """One positive int for all n spatial axes, or a list of n (or null: the layer decides)."""
    base = [{"type": "integer", "minimum": 1}, {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": n, "maxItems": n}]
    return base + ([{"type": "null"}] if nullable else [])


ACTIVATION = {
    "$ref": "#/$defs/activation_function",
    "title": "Activation",
    "description": "Applied to the output (Keras default: none, i.e. 'linear').",
    "default": "linear",
}
CENTER = {"title": "Center", "description": "Has the trainable offset beta (default true).", "type": "boolean", "default": True}
EPSILON = {"title": "Epsilon", "description": "Added to the variance (no effect on memory; default 0.001).", "type": "number", "default": 0.001}
FILTERS = {"title": "Filters", "description": "Number of output channels.", "type": "integer", "minimum": 1}
GROUPS = {
    "title": "Groups",
    "description": "Input channels and filters are split into this many groups (default 1).",
    "type": "integer",
    "minimum": 1,
    "default": 1,
}
PADDING = {
    "title": "Padding",
    "description": "'valid' (no padding: out = floor((n - d*(k-1) - 1)/s) + 1) or 'same' (out = ceil(n/s)).",
    "enum": ["valid", "same"],
    "default": "valid",
}
RETURN_SEQUENCES = {
    "title": "Return sequences",
    "description": "Return the whole sequence (batch, timesteps, units) rather than the last state (batch, units); default false.",
    "type": "boolean",
    "default": False,
}
SCALE = {"title": "Scale", "description": "Has the trainable scale gamma (default true).", "type": "boolean", "default": True}
UNITS_HIDDEN = {"title": "Units", "description": "Size of the hidden state.", "type": "integer", "minimum": 1}
USE_BIAS = {"title": "Use bias", "description": "Whether the layer has a bias vector (Keras default true).", "type": "boolean", "default": True}


def _layer(rule: Rule, doc: str, args: dict, required: tuple = ()) -> Rule:
    return replace(rule, doc=doc, args=args, required=required)


RULES: dict[str, Rule] = {
    "Dense": _layer(
        Rule(
            lambda p, s: [*s[:-1], p["units"]],
            lambda p, s: [("kernel", [s[-1], p["units"]], True), *_bias(p, [p["units"]])],
            lambda p, s, o: [IN],
            activation=True,
        ),
        "A fully connected layer on the last axis (a rank-3 input keeps its middle axis).",
        {
            "units": {"title": "Units", "description": "Size of the last axis of the output.", "type": "integer", "minimum": 1},
            "use_bias": USE_BIAS,
            "activation": ACTIVATION,
        },
        required=("units",),
    ),
    "Conv1D": _layer(
        _conv(1),
        "A 1D convolution over a channels-last input (batch, spatial, channels).",
        {
            "filters": FILTERS,
            "kernel_size": {"title": "Kernel size", "description": "One int for all 1 spatial axes, or a list of 1.", "anyOf": _ints(1)},
            "strides": {"title": "Strides", "description": "One int or a list of 1 (default 1).", "anyOf": _ints(1), "default": 1},
            "padding": PADDING,
            "dilation_rate": {
                "title": "Dilation rate",
                "description": "One int or a list of 1 (default 1); Keras does not allow it above 1 together with strides above 1.",
                "anyOf": _ints(1),
                "default": 1,
            },
            "groups": GROUPS,
            "use_bias": USE_BIAS,
            "activation": ACTIVATION,
        },
        required=("filters", "kernel_size"),
    ),
    "Conv2D": _layer(
        _conv(2),
        "A 2D convolution over a channels-last input (batch, spatial, spatial, channels).",
        {
            "filters": FILTERS,
            "kernel_size": {"title": "Kernel size", "description": "One int for all 2 spatial axes, or a list of 2.", "anyOf": _ints(2)},
            "strides": {"title": "Strides", "description": "One int or a list of 2 (default 1).", "anyOf": _ints(2), "default": 1},
            "padding": PADDING,
            "dilation_rate": {
                "title": "Dilation rate",
                "description": "One int or a list of 2 (default 1); Keras does not allow it above 1 together with strides above 1.",
                "anyOf": _ints(2),
                "default": 1,
            },
            "groups": GROUPS,
            "use_bias": USE_BIAS,
            "activation": ACTIVATION,
        },
        required=("filters", "kernel_size"),
    ),
    "Conv3D": _layer(
        _conv(3),
        "A 3D convolution over a channels-last input (batch, spatial, spatial, spatial, channels).",
        {
            "filters": FILTERS,
            "kernel_size": {"title": "Kernel size", "description": "One int for all 3 spatial axes, or a list of 3.", "anyOf": _ints(3)},
            "strides": {"title": "Strides", "description": "One int or a list of 3 (default 1).", "anyOf": _ints(3), "default": 1},
            "padding": PADDING,
            "dilation_rate": {
                "title": "Dilation rate",
                "description": "One int or a list of 3 (default 1); Keras does not allow it above 1 together with strides above 1.",
                "anyOf": _ints(3),
                "default": 1,
            },
            "groups": GROUPS,
            "use_bias": USE_BIAS,
            "activation": ACTIVATION,
        },
        required=("filters", "kernel_size"),
    ),
    "DepthwiseConv2D": _layer(
        Rule(
            _depthwise_shape,
            lambda p, s: [("kernel", [*_tuple(p["kernel_size"], 2, "kernel_size"), s[-1], p["depth_multiplier"]], True), *_bias(p, [s[-1] * p["depth_multiplier"]])],
            lambda p, s, o: [_kept_input(_depthwise_window(p, s))],
            activation=True,
        ),
        "A depthwise 2D convolution: each input channel convolved with depth_multiplier filters of its own.",
        {
            "kernel_size": {"title": "Kernel size", "description": "One int or a list of 2.", "anyOf": _ints(2)},
            "strides": {"title": "Strides", "description": "One int or a list of 2 (default 1).", "anyOf": _ints(2), "default": 1},
            "padding": PADDING,
            "depth_multiplier": {
                "title": "Depth multiplier",
                "description": "Output channels per input channel (default 1).",
                "type": "integer",
                "minimum": 1,
                "default": 1,
            },
            "dilation_rate": {"title": "Dilation rate", "description": "One int or a list of 2 (default 1).", "anyOf": _ints(2), "default": 1},
            "use_bias": USE_BIAS,
            "activation": ACTIVATION,
        },
        required=("kernel_size",),
    ),
    "SeparableConv2D": _layer(
        Rule(
            _separable_shape,
            _separable_weights,
            lambda p, s, o: [_kept_input(_depthwise_window(p, s)), _new("depthwise output", [*o[:-1], s[-1] * p["depth_multiplier"]])],
            activation=True,
        ),
        "A depthwise 2D convolution followed by a 1x1 pointwise one.",
        {
            "filters": FILTERS,
            "kernel_size": {"title": "Kernel size", "description": "One int or a list of 2.", "anyOf": _ints(2)},
            "strides": {"title": "Strides", "description": "One int or a list of 2 (default 1).", "anyOf": _ints(2), "default": 1},
            "padding": PADDING,
            "depth_multiplier": {
                "title": "Depth multiplier",
                "description": "Depthwise output channels per input channel (default 1).",
                "type": "integer",
                "minimum": 1,
                "default": 1,
            },
            "dilation_rate": {"title": "Dilation rate", "description": "One int or a list of 2 (default 1).", "anyOf": _ints(2), "default": 1},
            "use_bias": USE_BIAS,
            "activation": ACTIVATION,
        },
        required=("filters", "kernel_size"),
    ),
    "MaxPooling1D": _layer(
        _pool(1, True),
        "1D maximum pooling over a channels-last input.",
        {
            "pool_size": {"title": "Pool size", "description": "One int or a list of 1 (default 2).", "anyOf": _ints(1), "default": 2},
            "strides": {
                "title": "Strides",
                "description": "One int or a list of 1; default (null): the pool size.",
                "anyOf": _ints(1, nullable=True),
                "default": None,
            },
            "padding": PADDING,
        },
    ),
    "MaxPooling2D": _layer(
        _pool(2, True),
        "2D maximum pooling over a channels-last input.",
        {
            "pool_size": {"title": "Pool size", "description": "One int or a list of 2 (default 2).", "anyOf": _ints(2), "default": 2},
            "strides": {
                "title": "Strides",
                "description": "One int or a list of 2; default (null): the pool size.",
                "anyOf": _ints(2, nullable=True),
                "default": None,
            },
            "padding": PADDING,
        },
    ),
    "MaxPooling3D": _layer(
        _pool(3, True),
        "3D maximum pooling over a channels-last input.",
        {
            "pool_size": {"title": "Pool size", "description": "One int or a list of 3 (default 2).", "anyOf": _ints(3), "default": 2},
            "strides": {
                "title": "Strides",
                "description": "One int or a list of 3; default (null): the pool size.",
                "anyOf": _ints(3, nullable=True),
                "default": None,
            },
            "padding": PADDING,
        },
    ),
    "AveragePooling1D": _layer(
        _pool(1, False),
        "1D average pooling over a channels-last input.",
        {
            "pool_size": {"title": "Pool size", "description": "One int or a list of 1 (required, as in Keras).", "anyOf": _ints(1)},
            "strides": {
                "title": "Strides",
                "description": "One int or a list of 1; default (null): the pool size.",
                "anyOf": _ints(1, nullable=True),
                "default": None,
            },
            "padding": PADDING,
        },
        required=("pool_size",),
    ),
    "AveragePooling2D": _layer(
        _pool(2, False),
        "2D average pooling over a channels-last input.",
        {
            "pool_size": {"title": "Pool size", "description": "One int or a list of 2 (required, as in Keras).", "anyOf": _ints(2)},
            "strides": {
                "title": "Strides",
                "description": "One int or a list of 2; default (null): the pool size.",
                "anyOf": _ints(2, nullable=True),
                "default": None,
            },
            "padding": PADDING,
        },
        required=("pool_size",),
    ),
    "AveragePooling3D": _layer(
        _pool(3, False),
        "3D average pooling over a channels-last input.",
        {
            "pool_size": {"title": "Pool size", "description": "One int or a list of 3 (required, as in Keras).", "anyOf": _ints(3)},
            "strides": {
                "title": "Strides",
                "description": "One int or a list of 3; default (null): the pool size.",
                "anyOf": _ints(3, nullable=True),
                "default": None,
            },
            "padding": PADDING,
        },
        required=("pool_size",),
    ),
    "GlobalAveragePooling1D": _layer(
        _global(1, []),
        "The mean over the 1 spatial axes: (batch, channels).",
        {},
    ),
    "GlobalAveragePooling2D": _layer(
        _global(2, []),
        "The mean over the 2 spatial axes: (batch, channels).",
        {},
    ),
    "GlobalAveragePooling3D": _layer(
        _global(3, []),
        "The mean over the 3 spatial axes: (batch, channels).",
        {},
    ),
    "GlobalMaxPooling1D": _layer(
        _global(1, [IN, OUT]),
        "The maximum over the 1 spatial axes: (batch, channels).",
        {},
    ),
    "GlobalMaxPooling2D": _layer(
        _global(2, [IN, OUT]),
        "The maximum over the 2 spatial axes: (batch, channels).",
        {},
    ),
    "GlobalMaxPooling3D": _layer(
        _global(3, [IN, OUT]),
        "The maximum over the 3 spatial axes: (batch, channels).",
        {},
    ),
    "Flatten": _layer(
        Rule(lambda p, s: [s[0], math.prod(s[1:])], view=lambda p: True),
        "Flattens all axes but the batch axis (a view: no copy, nothing saved).",
        {},
    ),
    "Reshape": _layer(
        Rule(_reshape, view=lambda p: True),
        "Reshapes each sample (a view: no copy, nothing saved).",
        {
            "target_shape": {
                "title": "Target shape",
                "description": "The new shape of one sample, no batch axis; one dim may be -1 (inferred).",
                "type": "array",
                "minItems": 1,
                "items": {"type": "integer", "minimum": -1, "description": "A dim: a positive integer, or -1 once."},
            },
        },
        required=("target_shape",),
    ),
    "Dropout": _layer(
        Rule(lambda p, s: list(s), saved=lambda p, s, o: [_new("dropout mask", s, BOOL)] if p["rate"] > 0 else [], view=lambda p: p["rate"] == 0),
        "Dropout in training (inverted, scaled by 1/(1-rate)); keeps a one-byte mask.",
        {
            "rate": {
                "title": "Rate",
                "description": "Fraction of the units to drop, 0 <= rate < 1.",
                "type": "number",
                "minimum": 0,
                "exclusiveMaximum": 1,
            },
        },
        required=("rate",),
    ),
    "Activation": _layer(
        Rule(lambda p, s: list(s), saved=lambda p, s, o: [k for k in [ACTIVATIONS[p["activation"]]] if k], view=lambda p: ACTIVATIONS[p["activation"]] is None),
        "An activation function as a layer.",
        {
            "activation": {"$ref": "#/$defs/activation_function", "title": "Activation", "description": "The activation function's Keras name."},
        },
        required=("activation",),
    ),
    "ReLU": _layer(
        Rule(lambda p, s: list(s), saved=lambda p, s, o: [OUT]),
        "max(x, 0) as a layer (Keras's defaults).",
        {},
    ),
    "BatchNormalization": _layer(
        Rule(
            lambda p, s: list(s),
            lambda p, s: _norm_weights(p, s, moving=True),
            lambda p, s, o: [IN, _new("batch mean", [s[-1]], FLOAT32), _new("batch inverse std", [s[-1]], FLOAT32)],
        ),
        "Batch normalization over the last axis: gamma and beta are trained; moving_mean and moving_variance are non-trainable weights.",
        {
            "center": CENTER,
            "scale": SCALE,
            "momentum": {
                "title": "Momentum",
                "description": "Momentum of the moving statistics (no effect on memory; default 0.99).",
                "type": "number",
                "default": 0.99,
            },
            "epsilon": EPSILON,
        },
    ),
    "LayerNormalization": _layer(
        Rule(
            lambda p, s: list(s),
            lambda p, s: _norm_weights(p, s, moving=False),
            lambda p, s, o: [IN, _new("mean", [*s[:-1], 1], FLOAT32), _new("inverse std", [*s[:-1], 1], FLOAT32)],
        ),
        "Layer normalization over the last axis.",
        {"center": CENTER, "scale": SCALE, "epsilon": EPSILON},
    ),
    "Embedding": _layer(
        Rule(lambda p, s: [*s, p["output_dim"]], lambda p, s: [("embeddings", [p["input_dim"], p["output_dim"]], True)], lambda p, s, o: [IDS]),
        "A lookup table: integer ids (any shape) -> vectors; adds an output_dim axis.",
        {
            "input_dim": {"title": "Input dim", "description": "Vocabulary size (number of rows).", "type": "integer", "minimum": 1},
            "output_dim": {"title": "Output dim", "description": "Size of each vector.", "type": "integer", "minimum": 1},
        },
        required=("input_dim", "output_dim"),
    ),
    "SimpleRNN": _layer(
        Rule(_rnn_shape, _rnn_weights("simple_rnn_cell", 1), _rnn_saved(0, 0)),
        "A fully connected RNN (tanh) over a (batch, timesteps, features) input.",
        {"units": UNITS_HIDDEN, "return_sequences": RETURN_SEQUENCES, "use_bias": USE_BIAS},
        required=("units",),
    ),
    "LSTM": _layer(
        Rule(_rnn_shape, _rnn_weights("lstm_cell", 4), _rnn_saved(4, 3)),
        "A long short-term memory layer over a (batch, timesteps, features) input.",
        {"units": UNITS_HIDDEN, "return_sequences": RETURN_SEQUENCES, "use_bias": USE_BIAS},
        required=("units",),
    ),
    "GRU": _layer(
        Rule(_rnn_shape, _rnn_weights("gru_cell", 3), _rnn_saved(3, 4)),
        "A gated recurrent unit layer over a (batch, timesteps, features) input.",
        {
            "units": UNITS_HIDDEN,
            "return_sequences": RETURN_SEQUENCES,
            "use_bias": USE_BIAS,
            "reset_after": {
                "title": "Reset after",
                "description": "Apply the reset gate after the recurrent matmul (Keras default true, as cuDNN and PyTorch do); adds a second bias row.",
                "type": "boolean",
                "default": True,
            },
        },
        required=("units",),
    ),
    "MultiHeadAttention": _layer(
        Rule(_mha_shape, _mha_weights, _mha_saved, inner=("softmax", "dropout")),
        "Multi-head self-attention on the running (batch, sequence, features) tensor; output keeps its shape.",
        {
            "num_heads": {"title": "Heads", "description": "Number of attention heads.", "type": "integer", "minimum": 1},
            "key_dim": {"title": "Key dim", "description": "Size of each head for query and key.", "type": "integer", "minimum": 1},
            "value_dim": {
                "title": "Value dim",
                "description": "Size of each head for value (default null: key_dim).",
                "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "default": None,
            },
            "dropout": {
                "title": "Dropout",
                "description": "Dropout on the attention weights, 0 <= dropout < 1 (default 0).",
                "type": "number",
                "minimum": 0,
                "exclusiveMaximum": 1,
                "default": 0.0,
            },
            "use_bias": USE_BIAS,
        },
        required=("num_heads", "key_dim"),
    ),
    "ZeroPadding2D": _layer(
        Rule(_zero_pad_shape),
        "Pads height and width with zeros (a copy; its backward needs nothing saved).",
        {
            "padding": {
                "title": "Padding",
                "description": "One int for all four sides, [rows, cols] (each on both sides), or [[top, bottom], [left, right]]; default 1.",
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
                    {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
                        "minItems": 2,
                        "maxItems": 2,
                    },
                ],
                "default": 1,
            },
        },
    ),
    "Add": _layer(_merge(_elementwise_shape, lambda p, s, o: []), f"The sum of its inputs. {MERGE_DOC}; keeps nothing for backward.", {}),
    "Subtract": _layer(
        _merge(_elementwise_shape, lambda p, s, o: [], 2, 2),
        "inputs[0] - inputs[1] (exactly 2 tensors named in `inputs`); keeps nothing for backward.",
        {},
    ),
    "Multiply": _layer(_merge(_elementwise_shape, _chain_saved), f"The product of its inputs. {MERGE_DOC}; keeps every input (and each partial product).", {}),
    "Average": _layer(_merge(_elementwise_shape, lambda p, s, o: []), f"The mean of its inputs. {MERGE_DOC}; keeps nothing for backward.", {}),
    "Maximum": _layer(_merge(_elementwise_shape, _chain_saved), f"The elementwise maximum. {MERGE_DOC}; keeps every input (and each partial result).", {}),
    "Minimum": _layer(_merge(_elementwise_shape, _chain_saved), f"The elementwise minimum. {MERGE_DOC}; keeps every input (and each partial result).", {}),
    "Concatenate": _layer(
        _merge(_concat_shape, lambda p, s, o: []),
        "Joins the tensors named in `inputs` (at least 2) along `axis`; the other axes must agree. Keeps nothing for backward.",
        {"axis": {"title": "Axis", "description": "The axis to join along, batch axis 0 excluded; negative counts from the end (default -1: channels).", "type": "integer", "default": -1}},
    ),
}


# --- defaults (from the argument specs, which the generated schema shows editors too) ---
@lru_cache(maxsize=1)
def defaults() -> dict[str, dict]:
    return {name: {k: v["default"] for k, v in rule.args.items() if "default" in v} for name, rule in RULES.items()}


def snake(name: str) -> str:
    """Keras's automatic layer name: Conv2D -> conv2d, ReLU -> re_lu, MultiHeadAttention -> multi_head_attention."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


# --- the walk ---------------------------------------------------------------------------
@dataclass
class _Flow:
    """Distinct tensors: ids for identity, each counted once."""

    config: Emitted
    counted: set = field(default_factory=set)
    next_id: int = 0

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id


GRAPH_INPUT = "input_layer"  # Keras's name for keras.Input(...) when none is given


def derive(model: dict, emitted: Emitted) -> tuple[list[Tensor], list[Problem]]:
    """Weights and saved activations of a schema-valid `model` section; its layer rows go to `emitted.layers`
    (config.build.Emitted, what the model section emits; the Config itself is never changed).

    A layer takes the previous layer's output, or the tensors its `inputs` name (Keras's
    functional API): the graph input (`model.input_name`, default 'input_layer') or an earlier
    layer's output. Each tensor is one id, so a tensor several layers keep is counted once."""
    tensors: list[Tensor] = []
    problems: list[Problem] = []
    flow = _Flow(emitted)
    layers = model.get("layers", [])
    batch = model["batch_size"]
    shape = [batch, *model["input_shape"]]
    ids_in = bool(layers) and layers[0]["type"] == "Embedding"
    graph_input = (flow.fresh(), shape, INT64 if ids_in else None)  # (id, shape, dtype) of a tensor
    input_name = model.get("input_name", GRAPH_INPUT)
    names = layer_names(layers)
    first_use: dict[str, int] = {}  # layer name -> its first index
    for i, name in enumerate(names):
        first_use.setdefault(name, i)
    made: dict[str, tuple] = {}  # layer name -> its output tensor
    current = graph_input  # the previous layer's output
    row = None
    for i, layer in enumerate(layers):
        kind = layer["type"]
        rule = RULES[kind]
        p = {**defaults().get(kind, {}), **layer}
        path = ("model", "layers", i)
        name = names[i]
        incoming, wrong = _incoming(layer, rule, i, path, names, first_use, made, input_name, graph_input, current)
        if wrong:
            problems.extend(wrong)
            break
        shapes = [t[1] for t in incoming]
        given = shapes if rule.merge else shapes[0]
        try:
            out_shape = rule.shape(p, given)
            weights = rule.weights(p, given)
            specs = rule.saved(p, given, out_shape)
        except Mismatch as why:
            if rule.merge:
                named = " and ".join(f"{_shape_text(s)} from {n!r}" for s, n in zip(shapes, layer["inputs"]))
                message = f"{kind} cannot take the shapes {named}: {why}"
            else:
                message = f"{kind} cannot take the incoming shape {_shape_text(shapes[0])}: {why}"
            where = path + ("inputs",) if "inputs" in layer else path + ("type",)
            problems.append(Problem(where, codes.SHAPE_MISMATCH, message))
            break
        if name == input_name:
            where = path + ("name",) if "name" in layer else path + ("type",)
            problems.append(Problem(where, codes.DUPLICATE_LAYER, f"layer name {name!r} is the model's input (model.input_name); Keras requires unique layer names"))
        if first_use[name] != i:
            where = path + ("name",) if "name" in layer else path + ("type",)
            problems.append(Problem(where, codes.DUPLICATE_LAYER, f"layer name {name!r} is already used by model.layers[{first_use[name]}]; Keras requires unique layer names"))
        row = LayerRow(i, path, kind, name, out_shape, 0)
        emitted.layers.append(row)

        for weight, wshape, trainable in weights:
            tensor = make_tensor("parameters", path, f"{name}/{weight}", wshape, 1, trainable, None, emitted)
            tensors.append(tensor)
            row.params += tensor.elements
            (row.trainable if trainable else row.non_trainable).append((tensor.name, wshape))

        first = incoming[0]
        out = (first[0], out_shape, first[2]) if rule.view(p) else (flow.fresh(), out_shape, None)
        activation = ACTIVATIONS.get(p.get("activation", "linear")) if rule.activation else None
        if activation is not None:  # the layer's own output becomes a pre-activation tensor
            pre = (flow.fresh(), out_shape, None)
            resolved = [_resolve(s, incoming, pre, flow) for s in specs]
            resolved.append(_resolve(activation, [pre], out, flow, pre_activation=True))
        else:
            resolved = [_resolve(s, incoming, out, flow) for s in specs]
        for label, (tid, tshape, dtype) in resolved:
            _keep(flow, tensors, row, name, label, tid, tshape, dtype)
        made.setdefault(name, out)
        current = out

    if row is not None and not problems:
        _keep(flow, tensors, row, row.name, "output (kept by the loss)", *current)
        problems.extend(_unused(layers, names))
    return tensors, problems


def _unused(layers: list, names: list) -> list[Problem]:
    """Warnings for layers whose output no later layer reads and that are not the last: a dead
    branch, which Keras's functional Model(inputs, outputs) leaves out."""
    read = {name for layer in layers for name in layer.get("inputs", ())}
    read.update(names[i - 1] for i, layer in enumerate(layers) if i and "inputs" not in layer)
    out = []
    for i, (layer, name) in enumerate(zip(layers[:-1], names)):
        if name not in read:
            where = ("model", "layers", i) + (("name",) if "name" in layer else ("type",))
            out.append(Problem(where, codes.UNUSED_LAYER, f"the output of {name!r} reaches no later layer and is not the model's output (the last layer's): Keras's functional Model leaves it out, memfit counts it as written"))
    return out


def layer_names(layers: list) -> list[str]:
    """Each layer's Keras name: its own `name`, or the automatic one (conv2d, conv2d_1, ...),
    in declaration order, as Keras numbers layers in the order they are made."""
    seen: dict[str, int] = {}
    out = []
    for layer in layers:
        out.append(layer.get("name") or _auto_name(snake(layer["type"]), seen))
        for inner in RULES[layer["type"]].inner:
            _auto_name(inner, seen)
    return out


def _incoming(layer, rule, i, path, names, first_use, made, input_name, graph_input, current) -> tuple[list, list[Problem]]:
    """The tensors layer i takes: the previous output, or those its `inputs` name; problems
    (positioned on the offending name) for unknown names, forward references and counts."""
    kind = layer["type"]
    if "inputs" not in layer:
        if rule.merge:
            return [], [Problem(path + ("type",), codes.BAD_LAYER_INPUT, f"{kind} merges several tensors: name them with `inputs: [a, b]` (docs/layers.md, Graphs)")]
        return [current], []
    wanted = layer["inputs"]
    fewest, most = rule.merge or (1, 1)
    if len(wanted) < fewest or (most is not None and len(wanted) > most):
        count = f"exactly {fewest}" if fewest == most else f"at least {fewest}" if most is None else f"{fewest} to {most}"
        what = "input" if count == "exactly 1" else "inputs"
        return [], [Problem(path + ("inputs",), codes.BAD_LAYER_INPUT, f"{kind} takes {count} {what}; {len(wanted)} named")]
    out, problems = [], []
    for j, wanted_name in enumerate(wanted):
        where = path + ("inputs", j)
        if wanted_name == input_name:
            out.append(graph_input)
        elif wanted_name in made:
            out.append(made[wanted_name])
        elif wanted_name in first_use and first_use[wanted_name] >= i:
            k = first_use[wanted_name]
            why = "its own output" if k == i else f"the output of model.layers[{k}], which comes later"
            problems.append(Problem(where, codes.BAD_LAYER_INPUT, f"{kind} cannot take {why} ({wanted_name!r}): a layer takes only the model's input or earlier layers' outputs (a cycle has no order); list every layer after its inputs"))
        else:
            import difflib

            known = [input_name, *names[:i]]
            near = difflib.get_close_matches(str(wanted_name), known, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else f" (the graph input is {input_name!r})"
            problems.append(Problem(where, codes.BAD_LAYER_INPUT, f"{kind}'s input {wanted_name!r} is no earlier layer's name{hint}"))
    return out, problems


def _auto_name(base: str, seen: dict) -> str:
    n = seen.get(base, 0)
    seen[base] = n + 1
    return base if n == 0 else f"{base}_{n}"


def _resolve(spec, incoming: list, out, flow: _Flow, pre_activation: bool = False) -> tuple[str, tuple]:
    """A saved-tensor spec -> (label, (id, shape, dtype)); `incoming` is the layer's input tensors."""
    if spec == IDS:
        first = incoming[0]
        return "ids", first if first[2] == INT64 else (flow.fresh(), first[1], INT64)
    if spec == IN:
        return ("pre-activation" if pre_activation else "input"), incoming[0]
    if spec[0] == "in":  # ("in", k): a merge layer's k-th input
        return f"input {spec[1]}", incoming[spec[1]]
    if spec == OUT:
        return "output", out
    label, shape, dtype = spec
    return label, (flow.fresh(), shape, dtype)


def _keep(flow: _Flow, tensors: list, row: LayerRow, name: str, label: str, tid: int, shape, dtype) -> None:
    if tid in flow.counted:
        return
    flow.counted.add(tid)
    tensor = make_tensor("activations", row.path, f"{name} {label}", shape, 1, True, width(dtype) if dtype else None, flow.config)
    tensors.append(tensor)
    row.saved_bytes += tensor.bytes["activations"]
    row.saved.append((label, shape, dtype))
