"""The reference builds the Keras-form tests share (tests/models/test_frameworks.py, the peak and combination tests in
tests/ledger/): the layer cases, the seed model, and the same layers in plain PyTorch on channels-last tensors whose
saved bytes autograd reports.
"""

from __future__ import annotations

import math
import os

import needs

os.environ.setdefault("KERAS_BACKEND", "torch")
torch = needs.module("torch")
F = torch.nn.functional

from memfit.models.keras import RULES, defaults, layer_names  # noqa: E402

B = 2  # batch: small, the rules are per element

# --- cases: (input_shape, layers); every layer type appears at least once ---------------
ACTS = ["linear", "relu", "relu6", "sigmoid", "tanh", "softmax", "log_softmax", "exponential", "gelu", "silu", "swish", "elu", "selu", "softplus", "leaky_relu", "mish", "hard_sigmoid"]

SEED = (
    [80, 80, 4],
    [
        {"type": "Conv2D", "filters": 32, "kernel_size": [8, 8], "strides": [4, 4], "padding": "same"},
        {"type": "Activation", "activation": "relu"},
        {"type": "Conv2D", "filters": 64, "kernel_size": [4, 4], "strides": [2, 2], "padding": "same"},
        {"type": "Activation", "activation": "relu"},
        {"type": "Conv2D", "filters": 64, "kernel_size": [3, 3], "strides": [1, 1], "padding": "same"},
        {"type": "Activation", "activation": "relu"},
        {"type": "Flatten"},
        {"type": "Dense", "units": 512},
        {"type": "Activation", "activation": "relu"},
        {"type": "Dense", "units": 2},
    ],
)

CASES = {
    "seed-cnn": SEED,
    "mlp": ([12], [{"type": "Dense", "units": 16}, {"type": "ReLU"}, {"type": "Dense", "units": 8, "use_bias": False}, {"type": "ReLU"}, {"type": "Dense", "units": 3}]),
    "dense-rank3-activations": ([5, 7], [{"type": "Dense", "units": 6, "activation": "gelu"}, {"type": "Dense", "units": 4, "activation": "relu"}, {"type": "Dense", "units": 3, "activation": "tanh"}]),
    **{f"activation-{a}": ([4, 6], [{"type": "Dense", "units": 5}, {"type": "Activation", "activation": a}, {"type": "Dense", "units": 3}]) for a in ACTS},
    "conv1d-pools": (
        [17, 4],
        [
            {"type": "Conv1D", "filters": 6, "kernel_size": 3},
            {"type": "Conv1D", "filters": 6, "kernel_size": 3, "padding": "same", "dilation_rate": 2, "groups": 2, "activation": "relu"},
            {"type": "MaxPooling1D", "pool_size": 2, "padding": "same"},
            {"type": "Conv1D", "filters": 4, "kernel_size": 4, "strides": 2, "padding": "same", "use_bias": False},
            {"type": "AveragePooling1D", "pool_size": 2},
            {"type": "GlobalMaxPooling1D"},
        ],
    ),
    "conv2d-family": (
        [11, 10, 3],
        [
            {"type": "Conv2D", "filters": 6, "kernel_size": [3, 2], "strides": 2, "padding": "same"},
            {"type": "BatchNormalization"},
            {"type": "ReLU"},
            {"type": "DepthwiseConv2D", "kernel_size": 3, "depth_multiplier": 2, "padding": "same"},
            {"type": "SeparableConv2D", "filters": 5, "kernel_size": 2, "padding": "same", "activation": "silu"},
            {"type": "MaxPooling2D", "pool_size": 2, "strides": 1},
            {"type": "AveragePooling2D", "pool_size": [2, 1], "padding": "same"},
            {"type": "Conv2D", "filters": 4, "kernel_size": 2, "dilation_rate": 2, "groups": 1},
            {"type": "GlobalAveragePooling2D"},
            {"type": "Dense", "units": 3},
        ],
    ),
    "conv2d-odd-same-pool": (
        [9, 9, 2],
        [
            {"type": "Conv2D", "filters": 4, "kernel_size": 2, "padding": "same"},
            {"type": "MaxPooling2D", "pool_size": 2, "padding": "same"},
            {"type": "GlobalMaxPooling2D"},
        ],
    ),
    "conv3d": (
        [6, 7, 5, 2],
        [
            {"type": "Conv3D", "filters": 3, "kernel_size": 2, "activation": "relu"},
            {"type": "MaxPooling3D", "pool_size": 2, "padding": "same"},
            {"type": "Conv3D", "filters": 4, "kernel_size": [1, 2, 1], "padding": "same", "groups": 1},
            {"type": "AveragePooling3D", "pool_size": [1, 2, 1]},
            {"type": "GlobalMaxPooling3D"},
        ],
    ),
    "conv3d-global-average": ([4, 4, 4, 2], [{"type": "Conv3D", "filters": 3, "kernel_size": 3}, {"type": "GlobalAveragePooling3D"}, {"type": "Dense", "units": 2}]),
    "encoder": (
        [9],
        [
            {"type": "Embedding", "input_dim": 50, "output_dim": 8},
            {"type": "MultiHeadAttention", "num_heads": 2, "key_dim": 4},
            {"type": "LayerNormalization"},
            {"type": "Dense", "units": 16, "activation": "gelu"},
            {"type": "Dropout", "rate": 0.1},
            {"type": "Dense", "units": 8},
            {"type": "LayerNormalization"},
            {"type": "GlobalAveragePooling1D"},
            {"type": "Dense", "units": 2},
        ],
    ),
    "attention-value-dim": ([6, 8], [{"type": "MultiHeadAttention", "num_heads": 2, "key_dim": 3, "value_dim": 5}]),
    "attention-dropout": ([6, 8], [{"type": "MultiHeadAttention", "num_heads": 3, "key_dim": 2, "dropout": 0.2, "use_bias": False}]),
    "rnns": (
        [5, 7],
        [
            {"type": "SimpleRNN", "units": 4, "return_sequences": True},
            {"type": "LSTM", "units": 3, "return_sequences": True},
            {"type": "GRU", "units": 5, "return_sequences": True, "use_bias": False},
            {"type": "LSTM", "units": 2},
        ],
    ),
    "rnn-last": ([4, 3], [{"type": "SimpleRNN", "units": 6, "use_bias": False}, {"type": "Dense", "units": 2}]),
    "gru-last": ([6, 3], [{"type": "GRU", "units": 4}, {"type": "Dense", "units": 2}]),
    "reshapes": (
        [6, 4],
        [
            {"type": "Reshape", "target_shape": [3, -1]},
            {"type": "Dropout", "rate": 0.0},
            {"type": "Flatten"},
            {"type": "Reshape", "target_shape": [2, 3, 4]},
            {"type": "Conv2D", "filters": 2, "kernel_size": 2},
            {"type": "BatchNormalization", "center": False},
            {"type": "Flatten"},
            {"type": "BatchNormalization", "scale": False},
            {"type": "Dropout", "rate": 0.5},
        ],
    ),
    "bn-rank3": ([5, 3], [{"type": "BatchNormalization"}, {"type": "Activation", "activation": "sigmoid"}]),
}
# Graphs: layers name their inputs (Keras's functional API); merges take several
GRAPHS = {
    "graph-residual-block": (
        [8, 8, 3],
        [
            {"type": "Conv2D", "filters": 8, "kernel_size": 1, "name": "stem"},
            {"type": "BatchNormalization"},
            {"type": "ReLU", "name": "x"},
            {"type": "Conv2D", "filters": 8, "kernel_size": 3, "padding": "same"},
            {"type": "BatchNormalization"},
            {"type": "ReLU"},
            {"type": "Conv2D", "filters": 8, "kernel_size": 3, "padding": "same"},
            {"type": "BatchNormalization", "name": "branch"},
            {"type": "Add", "inputs": ["x", "branch"]},
            {"type": "ReLU", "name": "y"},
            {"type": "Conv2D", "filters": 16, "kernel_size": 1, "strides": 2, "name": "shortcut"},
            {"type": "Conv2D", "filters": 16, "kernel_size": 3, "strides": 2, "padding": "same", "inputs": ["y"], "name": "main"},
            {"type": "Add", "inputs": ["shortcut", "main"]},
            {"type": "ZeroPadding2D", "padding": [[1, 0], [2, 1]]},
            {"type": "Conv2D", "filters": 4, "kernel_size": 3, "strides": 2},
            {"type": "ZeroPadding2D"},
            {"type": "GlobalAveragePooling2D"},
            {"type": "Dense", "units": 3},
        ],
    ),
    "graph-inception-block": (
        [9, 9, 4],
        [
            {"type": "Conv2D", "filters": 6, "kernel_size": 3, "padding": "same", "activation": "relu", "name": "stem"},
            {"type": "Conv2D", "filters": 4, "kernel_size": 1, "activation": "relu", "name": "b1"},
            {"type": "Conv2D", "filters": 3, "kernel_size": 1, "activation": "relu", "inputs": ["stem"]},
            {"type": "Conv2D", "filters": 5, "kernel_size": 3, "padding": "same", "activation": "relu", "name": "b3"},
            {"type": "Conv2D", "filters": 2, "kernel_size": 1, "activation": "relu", "inputs": ["stem"]},
            {"type": "Conv2D", "filters": 3, "kernel_size": 5, "padding": "same", "activation": "relu", "name": "b5"},
            {"type": "MaxPooling2D", "pool_size": 3, "strides": 1, "padding": "same", "inputs": ["stem"]},
            {"type": "Conv2D", "filters": 2, "kernel_size": 1, "activation": "relu", "name": "bp"},
            {"type": "Concatenate", "inputs": ["b1", "b3", "b5", "bp"]},
            {"type": "GlobalAveragePooling2D"},
            {"type": "Dense", "units": 3},
        ],
    ),
    "graph-merges": (
        [6, 4],
        [
            {"type": "Dense", "units": 4, "name": "a"},
            {"type": "Dense", "units": 4, "name": "b", "inputs": ["input_layer"]},
            {"type": "Subtract", "inputs": ["a", "b"], "name": "d"},
            {"type": "Multiply", "inputs": ["a", "b", "d"], "name": "m"},
            {"type": "Maximum", "inputs": ["m", "a"], "name": "hi"},
            {"type": "Minimum", "inputs": ["m", "b", "d"], "name": "lo"},
            {"type": "Average", "inputs": ["hi", "lo", "a"], "name": "mean"},
            {"type": "Dense", "units": 1, "inputs": ["a"], "name": "gate"},
            {"type": "Multiply", "inputs": ["mean", "gate"], "name": "gated"},
            {"type": "Add", "inputs": ["gated", "gate"], "name": "sum"},
            {"type": "Concatenate", "axis": 1, "inputs": ["sum", "input_layer"]},
            {"type": "Dense", "units": 2},
        ],
    ),
}
CASES.update(GRAPHS)
# No PyTorch counterpart (torch's GRU is reset_after=True): Keras shapes and weights only.
KERAS_ONLY = {"gru-reset-before": ([5, 3], [{"type": "GRU", "units": 4, "reset_after": False, "return_sequences": True}])}


# --- plain PyTorch: what autograd keeps ---------------------------------------------------
ACT_FN = {
    "linear": lambda x: x, "relu": F.relu, "relu6": F.relu6, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "softmax": lambda x: F.softmax(x, -1), "log_softmax": lambda x: F.log_softmax(x, -1), "exponential": torch.exp,
    "gelu": F.gelu, "silu": F.silu, "swish": F.silu, "elu": F.elu, "selu": F.selu, "softplus": F.softplus,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "mish": F.mish, "hard_sigmoid": F.hardsigmoid,
}


def _first(x):  # channels-last (B, *spatial, C) -> a channels-first VIEW (B, C, *spatial)
    return x.movedim(-1, 1)


def _last(x):
    # back to channels-last; .contiguous() copies only when the kernel chose a channels-first
    # output, whose storage nothing saves (conv and pooling keep inputs), so counts are unchanged
    return x.movedim(1, -1).contiguous()


class Reference:
    """The same layers in plain PyTorch, on channels-last tensors (permuted views, no copies)."""

    def __init__(self):
        self.params, self.buffers = [], []

    def param(self, *shape):
        p = torch.nn.Parameter(torch.randn(*shape) * 0.1)
        self.params.append(p)
        return p

    def _window(self, x, n, p, kernel, strides, dilation, fill):
        """Keras 'same': symmetric pads go to the op; an odd total needs F.pad (a copy)."""
        size = x.shape[2:]
        k = [kernel] * n if isinstance(kernel, int) else kernel
        s = [strides] * n if isinstance(strides, int) else strides
        d = [dilation] * n if isinstance(dilation, int) else dilation
        if p["padding"] == "valid":
            return x, [0] * n, k, s, d
        pads = [max((-(-size[i] // s[i]) - 1) * s[i] + d[i] * (k[i] - 1) + 1 - size[i], 0) for i in range(n)]
        if all(t % 2 == 0 for t in pads):
            return x, [t // 2 for t in pads], k, s, d
        flat = []
        for t in reversed(pads):
            flat += [t // 2, t - t // 2]
        return F.pad(x, flat, value=fill), [0] * n, k, s, d

    def layer(self, spec, x):
        p = {**defaults()[spec["type"]], **spec}
        kind = spec["type"]
        if kind == "Dense":
            y = F.linear(x, self.param(p["units"], x.shape[-1]), self.param(p["units"]) if p["use_bias"] else None)
        elif kind.startswith("Conv"):
            n = int(kind[4])
            xc, pad, k, s, d = self._window(_first(x), n, p, p["kernel_size"], p["strides"], p["dilation_rate"], 0.0)
            w = self.param(p["filters"], x.shape[-1] // p["groups"], *k)
            conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
            y = _last(conv(xc, w, self.param(p["filters"]) if p["use_bias"] else None, s, pad, d, p["groups"]))
        elif kind in ("DepthwiseConv2D", "SeparableConv2D"):
            c, m = x.shape[-1], p["depth_multiplier"]
            xc, pad, k, s, d = self._window(_first(x), 2, p, p["kernel_size"], p["strides"], p["dilation_rate"], 0.0)
            last_bias = p["use_bias"] and kind == "DepthwiseConv2D"
            y = F.conv2d(xc, self.param(c * m, 1, *k), self.param(c * m) if last_bias else None, s, pad, d, c)
            if kind == "SeparableConv2D":
                y = F.conv2d(y, self.param(p["filters"], c * m, 1, 1), self.param(p["filters"]) if p["use_bias"] else None)
            y = _last(y)
        elif "Pooling" in kind and not kind.startswith("Global"):
            n = int(kind[-2])
            strides = p["strides"] if p["strides"] is not None else p["pool_size"]
            is_max = kind.startswith("Max")
            xc, pad, k, s, _ = self._window(_first(x), n, p, p["pool_size"], strides, 1, -math.inf if is_max else 0.0)
            if is_max:
                y = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1](xc, k, s, pad)
            else:
                y = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1](xc, k, s, pad, count_include_pad=False)
            y = _last(y)
        elif kind.startswith("Global"):
            axes = tuple(range(1, x.dim() - 1))
            y = x.amax(dim=axes) if "Max" in kind else x.mean(dim=axes)
        elif kind == "Flatten":
            y = x.reshape(x.shape[0], -1)
        elif kind == "Reshape":
            y = x.reshape(x.shape[0], *p["target_shape"])
        elif kind == "Dropout":
            # CUDA's dropout kernel (native_dropout) keeps a 1-byte bool mask; CPU's F.dropout
            # would keep a full-width float one. memfit follows CUDA, so the reference calls
            # the same kernel CUDA dispatches to (native_dropout also runs on the CPU).
            y = torch.native_dropout(x, p["rate"], True)[0] if p["rate"] > 0 else x
        elif kind == "Activation":
            y = ACT_FN[p["activation"]](x)
        elif kind == "ReLU":
            y = F.relu(x)
        elif kind == "BatchNormalization":
            c = x.shape[-1]
            mean, var = torch.zeros(c), torch.ones(c)
            self.buffers += [mean, var]
            y = _last(F.batch_norm(_first(x), mean, var, self.param(c) if p["scale"] else None, self.param(c) if p["center"] else None, training=True))
        elif kind == "LayerNormalization":
            c = x.shape[-1]
            y = F.layer_norm(x, (c,), self.param(c) if p["scale"] else None, self.param(c) if p["center"] else None, p["epsilon"])
        elif kind == "Embedding":
            y = F.embedding(x, self.param(p["input_dim"], p["output_dim"]))
        elif kind in ("SimpleRNN", "LSTM", "GRU"):
            cls = {"SimpleRNN": torch.nn.RNN, "LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}[kind]
            rnn = cls(x.shape[-1], p["units"], bias=p["use_bias"], batch_first=True)
            self.params += list(rnn.parameters())
            out, h = rnn(x)
            y = out if p["return_sequences"] else (h[0] if kind == "LSTM" else h)[0]
        elif kind == "MultiHeadAttention":
            y = self.attention(p, x)
        elif kind == "ZeroPadding2D":
            pad = p["padding"]
            (top, bottom), (left, right) = [[pad, pad]] * 2 if isinstance(pad, int) else [[v, v] if isinstance(v, int) else v for v in pad]
            y = F.pad(x, (0, 0, left, right, top, bottom))
        else:  # pragma: no cover - test_every_layer_type_is_cross_checked keeps this honest
            raise AssertionError(kind)
        if p.get("activation") and kind != "Activation":
            y = ACT_FN[p["activation"]](y)
        return y

    def attention(self, p, x):
        b, t, d = x.shape
        h, dk = p["num_heads"], p["key_dim"]
        dv = p["value_dim"] or dk

        def project(dim):
            return F.linear(x, self.param(h * dim, d), self.param(h * dim) if p["use_bias"] else None).view(b, t, h, dim).transpose(1, 2)

        q, k, v = project(dk), project(dk), project(dv)
        if p["dropout"] == 0:
            context = F.scaled_dot_product_attention(q, k, v)
        else:
            weights = torch.softmax((q * dk**-0.5) @ k.transpose(-1, -2), -1)
            context = torch.native_dropout(weights, p["dropout"], True)[0] @ v
        context = context.transpose(1, 2).reshape(b, t, h * dv)
        return F.linear(context, self.param(d, h * dv), self.param(d) if p["use_bias"] else None)


MERGE_OPS = {"Add": torch.add, "Subtract": torch.subtract, "Multiply": torch.multiply, "Maximum": torch.maximum, "Minimum": torch.minimum}


def merged(spec, xs):
    """Keras's merge layers as keras/src/layers/merging/*.py compute them: a left-to-right chain
    of the binary op (Average: the sum over the count), Concatenate one torch.cat."""
    kind = spec["type"]
    if kind == "Concatenate":
        return torch.cat(xs, dim=spec.get("axis", -1))
    out = xs[0]
    for x in xs[1:]:
        out = MERGE_OPS.get(kind, torch.add)(out, x)
    return out / len(xs) if kind == "Average" else out


def saved_by_autograd(input_shape, layers, batch=B) -> int:
    torch.manual_seed(0)
    ref = Reference()
    if layers[0]["type"] == "Embedding":
        x = torch.randint(0, layers[0]["input_dim"], (batch, *input_shape))
    else:
        x = torch.randn(batch, *input_shape, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    # oneDNN's fused LSTM keeps an opaque workspace; the rule follows PyTorch's native cell loop
    with torch.backends.mkldnn.flags(enabled=False), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = x
        made = {"input_layer": x}
        for spec, name in zip(layers, layer_names(layers)):
            given = [made[n] for n in spec["inputs"]] if "inputs" in spec else [y]
            y = merged(spec, given) if RULES[spec["type"]].merge else ref.layer(spec, given[0])
            made.setdefault(name, y)
    kept.setdefault(y.untyped_storage().data_ptr(), y.untyped_storage().nbytes())  # the loss keeps the output
    for owned in ref.params + ref.buffers:
        kept.pop(owned.untyped_storage().data_ptr(), None)
    return sum(kept.values())
