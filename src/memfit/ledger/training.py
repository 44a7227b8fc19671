"""The training step of a config, as ledger rows (ledger/step.py): every tensor it holds and when.

One builder per kind of model — a transformer (models.hf + models.hf_activations), a Keras-form
layer stack (models.keras), tensors declared as lists — and all of them take their bytes from the
same place as the footprint: a parameter's weight, gradient, gradient buffer, master copy and
optimizer state are the config's own tensors (config.tensors, priced by the recipe), an activation
is priced by the recipe from its element count and dtype. So the gated peak and the footprint count
the same tensors the same way, under any precision recipe, optimizer layout, adapter or quantized
base (issue 19: before, the peak rebuilt a transformer in fp32 with fp32 AdamW state).
"""

from __future__ import annotations


import re

from memfit.ledger import rewrites
from memfit.ledger.step import Loss, Row, Step
from memfit.models import held
from memfit.models.hf_nograd import checkpointed_flights
from memfit.models.hf_parts import layer_parts
from memfit.recipe.costs import dtype_bytes



def build(config, data: dict, optimizer: str | None, impl: str) -> Step:
    """The step of a config with a training section (`optimizer` None: torch.optim has no such
    optimizer, so its step's temporaries are not modelled)."""
    step = _build(config, data, optimizer, impl)
    training = data.get("training") or {}
    step.accumulating = isinstance(training.get("gradient_accumulation"), int) and training["gradient_accumulation"] > 1
    return rewrites.rewrite(step, config, training, rebuild=_rebuild(config, optimizer, impl))


def _rebuild(config, optimizer: str | None, impl: str):
    """A transformer's program built again with only some layers checkpointed (a technique's rewrite asks for it,
    ledger.rewrites); None for the other builders."""
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg"):
        return None
    own = [t for t in config.tensors if not t.path or t.path[0] != "model"]
    return lambda checkpointed: transformer_step(config, optimizer, impl, own, checkpointed=checkpointed)


def _build(config, data: dict, optimizer: str | None, impl: str) -> Step:
    model = getattr(config, "model", None)
    own = [t for t in config.tensors if not t.path or t.path[0] != "model"]  # declared lists, optimizer constants
    if model is not None and hasattr(model, "cfg"):
        return transformer_step(config, optimizer, impl, own)
    if "model" in data:
        training = data.get("training") or {}
        keras_model = {**data["model"], "batch_size": data["model"].get("batch_size", training.get("micro_batch"))}
        return keras_step(keras_model, config, optimizer, impl, declared=own)
    return tensors_step(own, optimizer, impl, config.overhead)


def _activation_bytes(config, elements: int, dtype: str | None = None) -> int:
    """An activation of `elements` elements: in its own dtype when the model names one, else in the recipe's."""
    if dtype is not None:
        return dtype_bytes(elements, dtype)
    return config.recipe.cost("activations", elements)["activations"]


def _master_dtype(config) -> str | None:
    """The dtype of the fp32 master copy optimizer.step() updates in place of a parameter, when the recipe keeps
    one."""
    resolved = getattr(config.recipe, "resolved", None)
    return getattr(resolved, "master_weights", None)


# --- declared tensors (`parameters:` / `activations:` lists) and optimizer constants ---------------
def declared_row(tensors, ids: dict) -> tuple[Row | None, list]:
    """The tensors a config lists itself, as one row ahead of any model: its parameters (count
    copies each), its activations, all kept for backward (what a list of tensors says: they are
    saved), and the optimizer state they bring (per parameter, then once-per-optimizer constants).
    `ids` (id -> bytes) receives the activations. (None, states) when no row is needed."""
    row = Row("declared tensors", grad_input=False, output_grad=False)
    states: list = []
    any_row = False
    for t in tensors:
        copies = max(t.count, 1)
        if t.category == "parameters":
            any_row = True
            each = t.bytes.get("parameters", 0) // copies
            if t.trainable:
                row.params += [each] * copies
                row.grads += [t.bytes.get("gradients", 0) // copies] * copies
                if t.bytes.get("optimizer_state"):
                    states += [t.bytes["optimizer_state"] // copies] * copies
            else:
                row.frozen += [each] * copies
        elif t.category == "activations":
            any_row = True
            for _ in range(copies):
                ids[len(ids) + 1] = t.bytes.get("activations", 0) // copies
                row.kept.append(len(ids))
        elif t.bytes.get("optimizer_state"):  # an optimizer's own constants (bitsandbytes' maps)
            states.append(t.bytes["optimizer_state"])
    if row.grads:  # its parameters are trained, so its backward runs (their gradients appear)
        row.output_grad = True
    return (row if any_row else None), states


def tensors_step(tensors, optimizer: str | None, impl: str, overhead: int = 0) -> Step:
    """A run described only by declared tensors: forward keeps all the activations, backward adds
    the gradients, the optimizer step its temporaries. No layer structure, so no flowing
    gradients: the backward is the footprint's total."""
    ids: dict = {}
    row, states = declared_row(tensors, ids)
    rows = [row] if row is not None else []
    return Step(rows, ids, [], Loss((), ()), states, optimizer, impl, overhead)


# --- the Keras-form layer stack (`model:`) -------------------------------------------------
def keras_step(model: dict, config, optimizer: str | None, impl: str, declared=()) -> Step:
    """The rows of a schema-valid, shape-checked `model` section under the config's recipe.

    Walks the layers as models.keras.derive does (the same RULES, the same tensor identities),
    keeping what derive folds away: which tensor each layer reads and writes. The loss is PyTorch's
    cross-entropy on the last layer's output with integer class labels (one per output row).
    `declared`: tensors listed explicitly beside the model (declared_row).

    A graph (layers naming their `inputs`) is walked in the declared order with the same wiring
    as derive, and its rows' transients follow the tensors' lifetimes (_graph_flights)."""
    from memfit.models.keras import ACTIVATIONS, GRAPH_INPUT, IDS, IN, INT64, OUT, RULES, defaults, layer_names

    recipe = config.recipe

    def nbytes(shape, dtype=None) -> int:
        n = 1
        for d in shape:
            n *= d
        return _activation_bytes(config, n, dtype)

    tensors: dict[int, int] = {}

    def fresh(shape, dtype=None) -> int:
        tensors[len(tensors) + 1] = nbytes(shape, dtype)
        return len(tensors)

    layers = model.get("layers", [])
    shape = [model["batch_size"], *model["input_shape"]]
    ids_in = bool(layers) and layers[0]["type"] == "Embedding"
    current = fresh(shape, INT64 if ids_in else None)
    current_dtype = INT64 if ids_in else None
    batch = [current]
    rows: list[Row] = []
    extra, states = declared_row(declared, tensors)
    if extra is not None:
        rows.append(extra)
    stepped: list[int] = []
    any_master = False
    requires_grad = False
    names = [r.name for r in config.layers] if len(config.layers) == len(layers) else [None] * len(layers)
    wiring = layer_names(layers)  # the names `inputs` refer to (derive's)
    made: dict[str, tuple] = {model.get("input_name", GRAPH_INPUT): (current, shape, current_dtype)}
    reads: list[list] = []  # each row's input ids
    for layer, name, wired in zip(layers, names, wiring):
        kind = layer["type"]
        rule = RULES[kind]
        p = {**defaults().get(kind, {}), **layer}
        if "inputs" in layer:
            sources = [made[n] for n in layer["inputs"]]
            current, shape, current_dtype = sources[0]
        else:
            sources = [(current, shape, current_dtype)]
        given = [t[1] for t in sources] if rule.merge else shape
        out_shape = rule.shape(p, given)
        row = Row(f"{name} ({kind})" if name else kind, input=current)
        reads.append([t[0] for t in sources])
        for _, wshape, trainable in rule.weights(p, given):
            n = 1
            for d in wshape:
                n *= d
            sizes = recipe.cost("parameters", n, 1, trainable, None, shape=list(wshape))
            if trainable:
                row.params.append(sizes["parameters"])
                row.grads.append(sizes.get("gradients", 0))
                states.append(sizes.get("optimizer_state", 0))
                master = _master_dtype(config)
                any_master = any_master or master is not None
                stepped.append(sizes["parameters"] if master is None else dtype_bytes(n, master))
            else:
                row.frozen.append(sizes["parameters"])
        row.grad_input = requires_grad
        view = rule.view(p)
        out = current if view else fresh(out_shape)
        row.output, row.view = out, view
        activation = ACTIVATIONS.get(p.get("activation", "linear")) if rule.activation else None
        specs = [(s, current, out) for s in rule.saved(p, given, out_shape)]
        if activation is not None:
            pre = fresh(out_shape)
            specs = [(s, current, pre) for s, _, _ in specs] + [(activation, pre, out)]
        for spec, incoming, result in specs:
            if spec == IDS:
                row.kept.append(incoming if current_dtype == INT64 else fresh(shape, INT64))
            elif spec == IN:
                row.kept.append(incoming)
            elif spec == OUT:
                row.kept.append(result)
            elif spec[0] == "in":  # a merge's k-th input
                row.kept.append(sources[spec[1]][0])
            else:
                label, sshape, dtype = spec
                row.kept.append(fresh(sshape, dtype))
                if label == "padded input":  # F.pad's copy: its gradient exists beside the op's own
                    row.backward_extra += tensors[row.kept[-1]]
        if activation is not None:
            row.inner = tensors[pre]
            row.inner_kept = pre in row.kept
        requires_grad = requires_grad or bool(row.grads)
        if not requires_grad:  # nothing upstream needs a gradient: autograd records no backward here
            row.output_grad = False
        rows.append(row)
        current, shape = out, out_shape
        current_dtype = current_dtype if view else None
        made.setdefault(wired, (current, shape, current_dtype))
    # the loss keeps the logits (as log_softmax's output of the same size); integer labels
    logits = tensors[current]
    if rows:
        rows[-1].kept.append(current)
    if any("inputs" in layer for layer in layers):
        passing = {i for i, layer in enumerate(layers) if layer["type"] in PASS_THROUGH}
        _graph_flights(rows[len(rows) - len(reads):], reads, tensors, batch[0], passing)
    labels = fresh(shape[:-1], INT64)
    batch.append(labels)
    declared_stepped = list(extra.params) if extra is not None else []
    return Step(rows, tensors, batch, Loss(forward=(logits,), backward=(logits, logits)), states, optimizer, impl, config.overhead,
                declared_stepped + stepped if any_master else None)


# Merges whose backward hands its inputs the output's gradient itself (torch.add passes it through
# when the shapes match; torch.cat's backward narrows it into views), not new tensors.
PASS_THROUGH = ("Add", "Concatenate")


def _graph_flights(rows: list, reads: list, size: dict, batch_input: int, passing: set) -> None:
    """A graph's transients per row, from each tensor's lifetime (a sequential stack's rows need
    none: a tensor there lives from its row to the next).

    Forward, at row i: every tensor nobody keeps that is made at or before i and read at or after
    i. Backward, at row i: the gradient of every tensor made at or before i that a row at or after
    i reads: the last row reading a tensor gives it its gradient, which lives until the row that
    made it has run its backward; a second reader's gradient is summed into a new tensor. A
    pass-through merge's inputs (`passing` rows) first hold its output's gradient itself (no new
    bytes), which then lives as long as they do."""
    kept = {t for row in rows for t in row.kept}
    made_at = {batch_input: -1}
    for i, row in enumerate(rows):
        if row.output is not None and not row.view:
            made_at.setdefault(row.output, i)
    readers: dict[int, list] = {t: [len(rows)] for t in ([rows[-1].output] if rows else [])}  # the loss reads the output
    for i, ids in enumerate(reads):
        for t in ids:
            readers.setdefault(t, []).append(i)
    graded = [t for t, i in made_at.items() if i >= 0 and rows[i].output_grad and t in readers]
    spans: dict[int, list] = {}  # gradient storage -> [(lowest row, highest row)] it is alive over
    for t in graded:
        order = sorted(set(readers[t]), reverse=True)
        first, low = order[0], made_at[t]
        aliased = first in passing and first < len(rows) and (rows[first].output is not None) and (
            size[t] == size[rows[first].output] or rows[first].name.endswith("(Concatenate)"))
        if aliased:
            second = order[1] if len(order) > 1 else low
            spans.setdefault(rows[first].output, []).append((second if len(order) > 1 else low, first))
            if len(order) > 1:  # summed with the next reader's gradient: a tensor of its own from there
                spans.setdefault(t, []).append((low, second))
        else:
            spans.setdefault(t, []).append((low, first))
    # both sums by a sweep over the rows (a difference array per pass), not a scan of every tensor at every row: a
    # merge of N branches is N rows and N tensors, and the scan was N x N (issue 33: 12,000 branches, over 10 s)
    n = len(rows)
    forward = [0] * (n + 1)
    for t, at in made_at.items():
        if t in kept:
            continue
        lo, hi = max(at, 0), min(max(readers.get(t, [at])), n - 1)
        if lo <= hi:
            forward[lo] += size[t]
            forward[hi + 1] -= size[t]
    merged: dict[int, list] = {}  # each gradient storage's ranges, overlaps joined: counted once at a row
    backward = [0] * (n + 1)
    for t, ranges in spans.items():
        joined: list = []
        for lo, hi in sorted(ranges):
            if joined and lo <= joined[-1][1] + 1:
                joined[-1][1] = max(joined[-1][1], hi)
            else:
                joined.append([lo, hi])
        merged[t] = joined
        for lo, hi in joined:
            lo, hi = max(lo, 0), min(hi, n - 1)
            if lo <= hi:
                backward[lo] += size[t]
                backward[hi + 1] -= size[t]

    def alive_at(t, i: int) -> bool:
        return any(lo <= i <= hi for lo, hi in merged.get(t, ()))

    flight = total = 0
    for i, row in enumerate(rows):
        flight += forward[i]
        total += backward[i]
        row.forward_flight = flight + (0 if row.inner_kept else row.inner)
        if not row.output_grad:
            continue
        own = row.output if alive_at(row.output, i) and made_at.get(row.output) == i else None
        new = {t for t in reads[i] if alive_at(t, i) and max(readers[t]) == i}
        if row.inner:  # the activation's backward (the inputs' gradients not yet made), then the row's own (its output's freed)
            first = total - sum(size[t] for t in new) + row.inner
            second = total - (size[own] if own is not None else 0) + row.inner + row.backward_extra
            row.backward_flight = max(first, second)
        else:
            row.backward_flight = total + row.backward_extra


# --- transformers models (models.hf: names and shapes; models.hf_activations: what is kept) ----------
_LAYER = re.compile(r"\.(?:layers|h|layer)\.(\d+|\*)\.")


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def transformer_step(config, optimizer: str | None, impl: str, declared=(), shape=None, rank_sizes=None,
                     checkpointed=None) -> Step:
    """One training step of a transformers model: embeddings, each layer as four parts, the head (with the loss).

    What each block keeps comes from models.hf_activations.saved under the same recipe arguments as
    the footprint (precision, LoRA, a quantized base: config.model.recipe); each parameter's bytes
    are its config tensor's (weight, gradient, buffers, master copy, optimizer state, as the recipe
    priced them). The loss is transformers' ForCausalLMLoss: an fp32 copy of the logits when they
    are not fp32, log-softmax (kept), and in backward two fp32 logits-sized gradients.

    A tensor-parallel rank's program (ledger.ranks): `shape` evaluates each saved tensor's shape with the rank's
    share (models.hf_sharded.rank_shape), `rank_sizes` gives the rank's sizes for the in-flight tensors.
    `checkpointed`: under full checkpointing, the indices of the layers that are checkpointed (None: every layer);
    the others keep what they keep without checkpointing (partial checkpointing, ledger/techniques)."""
    from memfit.models import hf_act_flights, hf_activations as acts, hf_encdec

    model = config.model
    cfg, run = model.cfg, model.training
    recipe_args = dict(getattr(model, "recipe", None) or {})
    precision = recipe_args.get("precision", "32-true")
    common = dict(micro_batch=run["micro_batch"], seq_len=run["seq_len"], attention=run["attention"], dtypes=model.dtypes, **recipe_args)
    if shape is not None:
        common["shape"] = shape
    checkpointing = run["checkpointing"]
    blocks = acts.saved(cfg, checkpointing=checkpointing, **common)
    roles = acts.role_dtypes(precision, model.dtypes)
    sizes = acts.layer_sizes(cfg, run["micro_batch"], run["seq_len"], target_len=recipe_args.get("target_len"), moe=recipe_args.get("moe"))
    if rank_sizes is not None:
        sizes = rank_sizes(sizes)
    b, s, h, T = sizes["b"], sizes["s"], sizes["h"], sizes["T"]
    n_layers = acts.count_layers(cfg)
    stacked = hf_encdec.is_stacked(cfg)  # an encoder-decoder: its layers are those of its stacks in forward order

    tensors: dict[int, int] = {}

    def fresh(nbytes: int) -> int:
        tensors[len(tensors) + 1] = nbytes
        return len(tensors)

    kept_bytes = _kept_bytes

    def kept_ids(kept, input_id, input_bytes, tokens=None):
        """Fresh ids, but the row's input where the first kept tensor is it (a norm keeping its fp32 input)."""
        out = []
        for n, k in enumerate(kept):
            nbytes = kept_bytes(k)
            if (n == 0 and input_id is not None and nbytes == input_bytes and _elements(k.shape) == (tokens or b * s) * h
                    and "input" in k.label):
                out.append(input_id)
            else:
                out.append(fresh(nbytes))
        return out

    # the final norm (model.norm, transformer.ln_f) is its own row before the head where the family has one
    norm_kept = [k for k in blocks[-2].kept if k.label.startswith(FINAL_NORM)] if not stacked else []
    groups, tied_grad = _weight_groups(config, cfg, n_layers, stacked, final_norm(cfg) if norm_kept else None)
    weights = _Weights(groups, _master_dtype(config))

    emb, layer_blocks, head, loss = blocks[0], blocks[1:-2], blocks[-2], blocks[-1]
    per_layer = [blk.kept for blk in layer_blocks for _ in range(blk.count)]
    hidden = dtype_bytes(b * sizes.get("stream", s) * h, roles["act"])  # the residual stream (a sequence-parallel rank's: its slice)
    # an encoder-decoder's encoder runs over seq_len source tokens (its input ids), its decoder over target_len (`s`)
    encoder_layers = hf_encdec.stacks(cfg)[0][2] if stacked else 0
    ids, labels = fresh(dtype_bytes(b * (sizes["se"] if stacked else s), "int64")), fresh(dtype_bytes(b * s, "int64"))
    enc_sizes = {**sizes, "s": sizes["se"], "T": sizes["Te"]} if stacked else sizes
    enc_hidden = dtype_bytes(b * enc_sizes["s"] * h, roles["act"])
    rows = []
    extra, declared_states = declared_row(declared, tensors)
    if extra is not None:
        rows.append(extra)
    x = fresh(enc_hidden if encoder_layers else hidden)
    row = weights(Row("embeddings", input=ids, output=x, grad_input=False), "embeddings")
    row.kept = [ids if k.label.endswith("input ids") else fresh(kept_bytes(k)) for k in emb.kept]
    later_kept: dict = {}   # layer -> ids of the embeddings block's tensors that layer's first row keeps instead
    if stacked:  # what the embeddings block keeps for the decoder goes with a later layer (hf_act_t5)
        later = acts.t5_later_kept(emb.kept, encoder_layers)
        for n, layer in later.items():
            later_kept.setdefault(layer, []).append(row.kept[n])
        row.kept = [t for n, t in enumerate(row.kept) if n not in later]
    # (the model's buffers are config tensors, models/buffers.py: with the embeddings' frozen parameters)
    batch = [ids, labels]
    pixel_bytes = acts.batch_pixel_bytes(cfg, run["micro_batch"])
    if pixel_bytes:   # a vision-language batch's pixel values, held all step; a kept view of them is no copy
        batch.append(fresh(pixel_bytes))
        row.kept = [batch[-1] if acts.views_the_pixels(k) else t for k, t in zip(emb.kept, row.kept)]
    if not row.grads and not tied_grad and checkpointing != "full":
        # a frozen embedding (LoRA): autograd records no backward for it (under full checkpointing transformers
        # makes its output require a gradient, hf_activations._evaluate: that gradient is computed)
        row.output_grad = False
    # a weight tied to the head: the embedding's backward makes its own part of the gradient, which autograd's input
    # buffer adds to the head's out of place: both parts and their sum at once (tests/ledger/test_tied_gradient.py)
    row.backward_extra += 2 * tied_grad
    row.grad_completed = tied_grad
    rows.append(row)
    every, bound = _every_layer(cfg, common, checkpointing, stacked, per_layer, encoder_layers, enc_hidden, hidden)
    k = hf_act_flights.layer_kernels(cfg, run, recipe_args, sizes, enc_sizes, roles, checkpointing, stacked, model.dtypes)
    x = _layer_rows(k, rows, x, every, bound, later_kept, fresh, weights, kept_ids, cfg, sizes, enc_sizes, checkpointing, stacked,
                    encoder_layers, enc_hidden, hidden, n_layers, checkpointed, bool(recipe_args.get("lora")), not _fsdp(config))
    if norm_kept:
        normed = fresh(hidden)
        row = weights(Row(FINAL_NORM, input=x, output=normed), FINAL_NORM)
        row.kept = kept_ids(norm_kept, x, hidden)
        row.backward_flight = hf_act_flights.final_norm_flight(cfg, sizes, hidden)
        rows.append(row)
        x = normed
    logits = fresh(dtype_bytes(T * sizes["V"], roles["lin"]))
    row = weights(Row("head", input=x, output=logits), "head")
    row.kept = kept_ids([k for k in head.kept if k not in norm_kept], x, hidden)
    row.grad_started = tied_grad  # the tied weight's part its backward makes, summed with the embedding's later
    by_loss = [fresh(kept_bytes(k)) for k in loss.kept]
    rows.append(row)
    # what the causal LM's forward holds unsaved through the loss: the cache's copies of k and v, the head's input
    stacked_cache = acts.t5_cache_copies(cfg, sizes, roles, model.dtypes, precision, checkpointing) if stacked else None
    kept_unsaved = _held_through_forward(rows, every, x, hidden, roles, model.dtypes, precision, checkpointing, stacked, k.fam,
                                         stacked_cache, cfg, sizes["H"], sizes["KV"], sizes)
    loss = _loss(loss, tensors[logits], T * sizes["V"], roles, kept_unsaved, hidden, precision, stacked)
    declared_stepped = list(extra.params) if extra is not None else []
    return Step(rows, tensors, batch, loss, declared_states + weights.states, optimizer, impl, config.overhead,
                declared_stepped + weights.stepped if weights.any_master else None, loss_kept=by_loss,
                kwargs_held=() if stacked else _kwargs_held(cfg, k.fam, run["attention"], checkpointing, sizes, roles, rows))


def _kwargs_held(cfg: dict, fam, attention: str, checkpointing: str, sizes: dict, roles: dict, rows: list) -> tuple:
    """(bytes, the index of the first row of the lowest layer taking it) of each tensor a checkpointed layer holds
    as a keyword argument (models/held.checkpoint_kwargs: eager attention's float masks; Step.kwargs_held)."""
    def first_row(layer: int) -> int:
        return next(i for i, row in enumerate(rows) if row.name.startswith("layer ") and row.name.split()[1] == str(layer))
    return tuple((size, first_row(layer)) for size, layer in held.checkpoint_kwargs(cfg, fam, attention, checkpointing, sizes, roles))


FINAL_NORM = "final norm"  # the row of a decoder's final norm (and the label prefix of what it keeps)


def _loss(rules, logits_bytes: int, logits: int, roles: dict, kept_unsaved: int, hidden: int, precision: str, stacked: bool) -> Loss:
    """The loss's moments: the logits (and their fp32 copy where the loss computes in fp32) with what the forward
    holds unsaved, then the logits' gradients. The loss computes in its log-softmax's dtype: a causal LM's
    logits.float() copy (fp32), autocast's fp32 cross-entropy, or BERT's masked-LM loss on the 16-bit logits as they
    are (no copy; its gradients in that dtype)."""
    from memfit.models import hf_activations as acts

    logits32 = dtype_bytes(logits, "float32")
    if stacked:  # T5's nn.CrossEntropyLoss (hf_act_t5)
        return Loss(*acts.t5_loss(logits_bytes, logits32, hidden, precision, kept_unsaved))
    in_loss = next((q.dtype for q in rules.kept if "log-softmax" in q.label), "float32")
    upcast = logits32 if in_loss != roles["lin"] else 0
    if not upcast:
        logits32 = dtype_bytes(logits, in_loss)
    held = (kept_unsaved,) if kept_unsaved else ()
    return Loss(forward=(logits_bytes, *([upcast] if upcast else []), *held), backward=(logits32, logits32),
                upcast=upcast, held=held)


def _held_through_forward(rows: list, every: list, x: int, hidden: int, roles: dict, dtypes: dict | None, precision: str,
                          checkpointing: str, stacked: bool, fam, stacked_cache: list | None = None, cfg: dict | None = None,
                          heads: int = 0, kv_heads: int = 0, sizes: dict | None = None) -> int:
    """The bytes the forward holds unsaved at the loss (models/held.py; an encoder-decoder's cache copies:
    `stacked_cache`, hf_act_t5.t5_cache_copies); each layer row's forward moment gets the cache copies made so far."""
    cache = stacked_cache if stacked else [0] * len(every)
    if checkpointing == "none" and not stacked:
        quantized, mixed = bool((dtypes or {}).get("quantized")), precision.endswith("-mixed")
        heads = (heads if fam.cache and cfg.get("use_cache", True) else 0) if cfg is not None else 0
        frozen = held.frozen_cache(fam, sizes, roles, quantized, mixed) if sizes is not None else 0
        cache = [held.cache_copies(kept, roles, bool(fam.rope), quantized, mixed, heads, kv_heads, frozen) for kept in every]
    if any(cache):
        for row in rows:
            if row.name.startswith("layer ") and row.forward_flight is not None:
                row.forward_flight += sum(cache[: int(row.name.split()[1]) + 1])
            if row.name.startswith("layer ") and row.forward_early is not None:
                row.forward_early += sum(cache[: int(row.name.split()[1]) + 1])
    if stacked:
        return sum(cache)   # (T5's loss already holds its decoder output: transformer_step)
    head = rows[-1]
    return sum(cache) + (hidden if x not in head.kept else 0)


def final_norm(cfg: dict) -> str | None:
    """The module path of a decoder's final norm (the last norm after the layers, before the head), None for an
    encoder-decoder."""
    from memfit.models import hf, hf_encdec

    if hf_encdec.is_stacked(cfg):
        return None
    after = hf.module_tree(cfg)[3]
    return next((m.path for m in after[:-1] if "norm" in m.type), None)


def _weight_groups(config, cfg: dict, n_layers: int, stacked: bool, norm: str | None = None) -> tuple:
    """A transformer's parameters by row of the step, from the config's own tensors (as the recipe priced them):
    ({row key: [(bytes per category of one copy, trainable, elements)]}, the tied head weight's gradient bytes).
    `norm`: the final norm's module path when it is a row of its own (its parameters in FINAL_NORM)."""
    from memfit.models import hf, hf_encdec

    # parameters by row, from the config's own tensors: embeddings; each layer as four parts
    # (norm and attention, its output projection, norm and MLP, its down projection); the final norm; the head
    groups: dict = {"embeddings": [], FINAL_NORM: [], "head": []}
    seen_layer = False
    tied, tied_grad = hf.tied_embedding(cfg), 0
    for t in config.tensors:
        if t.category != "parameters" or not t.path or t.path[0] != "model":
            continue
        per_copy = {c: v // max(t.count, 1) for c, v in t.bytes.items()}
        entry = (per_copy, t.trainable, t.elements)
        if stacked:
            if _base_name(t.name) == hf_encdec.outer_modules(cfg)[0] + ".weight":
                # T5's shared embedding is lm_head's weight (T5Config always ties them): the head's backward makes its
                # gradient's first part, which autograd's input buffer holds until the decoder's and the encoder's
                # embeddings add theirs (measured, MemTracker with a dispatch-mode trace, tiny T5 32-true and
                # bf16-mixed under full checkpointing: the (V, h) fp32 part alive from lm_head's backward on)
                groups["head"].append(entry)
                tied_grad = per_copy.get("gradients", 0) if t.trainable else 0
                continue
            index = hf_encdec.layer_index(cfg, _base_name(t.name))
            if isinstance(index, int):
                groups.setdefault((index, _part(t.name)), []).append(entry)
            else:
                groups[index].append(entry)
            continue
        m = _LAYER.search(t.name)
        if m and ".vision_tower." not in t.name:   # (LLaVA's vision layers run with the embeddings row)
            seen_layer = True
            layers = range(n_layers) if m.group(1) == "*" else (int(m.group(1)),)
            part = _part(t.name)
            for i in layers:
                groups.setdefault((i, part), []).append(entry)
        elif _base_name(t.name) == tied:
            # the head's backward makes the shared weight's gradient; the embedding's backward adds its part later
            groups["head"].append(entry)
            tied_grad = per_copy.get("gradients", 0) if t.trainable else 0
        elif seen_layer and norm is not None and _base_name(t.name).startswith(norm + "."):
            groups[FINAL_NORM].append(entry)
        else:
            groups["head" if seen_layer else "embeddings"].append(entry)
    return groups, tied_grad


class _Weights:
    """What each row's parameters add to it (trainable: weight, gradient; frozen: weight), with the optimizer state
    and what optimizer.step() updates (the master copy where the recipe has one) collected in row order."""

    def __init__(self, groups: dict, master: str | None) -> None:
        self.groups, self.master = groups, master
        self.stepped: list[int] = []
        self.states: list[int] = []
        self.any_master = False
        self.priced: dict = {}  # a group's entries -> what they add to a row (a 70B's 80 layers share each part's entries)

    def __call__(self, row: Row, key) -> Row:
        master = self.master
        entries = self.groups.get(key, ())
        signature = tuple(map(id, entries))
        adds = self.priced.get(signature)
        if adds is None:
            adds = self.priced[signature] = ([], [], [], [], [])
            params, grads, state, steps, frozen = adds
            for per_copy, trainable, elements in entries:
                if trainable:
                    params.append(per_copy.get("parameters", 0))
                    grads.append(per_copy.get("gradients", 0))
                    state.append(per_copy.get("optimizer_state", 0))
                    steps.append(per_copy.get("parameters", 0) if master is None else dtype_bytes(elements, master))
                else:
                    frozen.append(per_copy.get("parameters", 0))
        row.params += adds[0]
        row.grads += adds[1]
        self.states.extend(adds[2])
        self.stepped.extend(adds[3])
        row.frozen += adds[4]
        self.any_master = self.any_master or (master is not None and bool(adds[1]))
        return row


def _kept_bytes(k) -> int:
    return dtype_bytes(_elements(k.shape), k.dtype)


def _boundary_kept(kept: list, hidden: int) -> int:
    """The bytes of a checkpointed layer's recomputed tensors that are its input itself (kept already as the
    checkpoint's boundary): `hidden` where the layer's first kept tensor is its input (a norm keeping its fp32
    input in fp32), else 0: a norm that upcasts a 16-bit input keeps an fp32 copy of it, made again by the
    recomputation beside the boundary (measured: LoRA q, v in bf16-true, a dispatch-mode trace of layer 1's
    recomputation at MemTracker's peak: input_layernorm's fp32 copy alive beside the layer's bf16 input)."""
    first = kept[0] if kept else None
    return hidden if first is not None and _kept_bytes(first) == hidden and "input" in first.label else 0


def _every_layer(cfg: dict, common: dict, checkpointing: str, stacked: bool, per_layer: list, encoder_layers: int,
                 enc_hidden: int, hidden: int) -> tuple:
    """(each layer's kept tensors as its parts run them, and under full checkpointing each layer's bound: what the
    whole layer holds while its backward recomputes it, beyond its input)."""
    from memfit.models import hf_activations as acts

    kept_bytes = _kept_bytes
    bound = None
    if checkpointing == "full":
        # a part's recomputed tensors follow the un-checkpointed layer's order; what the whole layer holds while
        # its backward recomputes it is bounded by the footprint's figure (hf_activations.recomputed: the
        # checkpointed forward runs without the key/value cache), so the peak's saved activations never exceed
        # the footprint's
        again = acts.recomputed(cfg, **common)
        if stacked:  # T5's checkpointed layers run other kernels (the cross-attention's zero bias then needs a
            every = again  # gradient: SDPA's math path), so the parts are those of the recomputation itself
        else:
            # (without the key/value cache: transformers turns use_cache off under gradient checkpointing, so a
            # fused qkv model's recomputed v is a view of the whole qkv output, not the cache's copy; measured: GPT-NeoX
            # bf16-true, a dispatch-mode trace of layer 1's recomputation at MemTracker's peak)
            full = acts.saved(dict(cfg, use_cache=False), checkpointing="none", **common)
            every = [blk.kept for blk in full[1:-2] for _ in range(blk.count)]
            # transformers' activation_checkpointing_enable makes the embeddings' output require a gradient
            # (enable_input_require_grads): under LoRA the first layer's input then needs one, so its recomputation
            # saves what the un-checkpointed first layer does not (its norm's input, the base and adapter weight
            # casts of q, k, v): that layer's parts are the recomputation's own where it adds to the same order
            # (measured under autocast, tests/ledger/test_lora_input_copy.py; and in bf16-true, a dispatch-mode trace
            # at MemTracker's peak, Gemma 3 LoRA q, v: layer 0's recomputation holds its input_layernorm's and
            # k_norm's tensors; a 16-bit QLoRA run's measured peak, tests/ledger/test_combinations.py, does not hold
            # them: left as it was there)
            quantized = bool((common.get("dtypes") or {}).get("quantized"))
            if str(common.get("precision", "")).endswith("-mixed") or not quantized:
                every = [a if _adds_to(a, e) else e for a, e in zip(again, every)] + every[len(again):]
        layer_bytes: dict = {}  # by list: most layers share one (a fit search walks every layer of a 70B many times)
        for kept in again:
            if id(kept) not in layer_bytes:
                layer_bytes[id(kept)] = sum(kept_bytes(k) for k in kept)
        bound = [layer_bytes[id(kept)] - _boundary_kept(kept, enc_hidden if i < encoder_layers else hidden) for i, kept in enumerate(again)]
    else:
        every = per_layer
    return every, bound


def _t5_stack_ends(row: Row, k, i: int, names: list, encoder_layers: int, n_layers: int) -> None:
    """T5 under full checkpointing (models/hf_act_t5): a stack's first layer recomputes its relative bias (and the
    decoder's its cross-attention's zero bias), unsaved but alive until the recomputation ends (t5_first_recomputed);
    the gradients the decoder's last layer's backward makes for what its first layer and the encoder pass the later
    layers are held, accumulated into, until the first decoder layer's backward is done: alive through the layers
    between, their recomputations included (t5_held_gradients). `names`: the layer's parts up to this row's."""
    if row.recompute_moment is not None and i in (0, encoder_layers):
        made = k.first_recomputed["encoder" if i < encoder_layers else "decoder"]
        redone_bytes, flight = row.recompute_moment
        row.recompute_moment = (redone_bytes, flight + sum(nbytes for p, nbytes in made.items() if p in names))
    if k.held_gradients and i == n_layers - 1:
        row.grads_born = list(k.held_gradients.get(names[-1], ()))
    if k.held_gradients and i == encoder_layers and len(names) == 1:
        row.grads_taken = [g for made in k.held_gradients.values() for g in made]
    # the encoder's shared position bias's gradient, from its last layer's backward to its first's (t5_encoder_held_gradients)
    if k.enc_held and i == encoder_layers - 1:
        row.grads_born = list(k.enc_held.get(names[-1], ()))
    if k.enc_held and i == 0 and len(names) == 1:
        row.grads_taken = [g for made in k.enc_held.values() for g in made]


def _layer_rows(k, rows: list, x: int, every: list, bound, later_kept: dict, fresh, weights, kept_ids, cfg: dict, sizes: dict,
                enc_sizes: dict, checkpointing: str, stacked: bool, encoder_layers: int, enc_hidden: int, hidden: int,
                n_layers: int, checkpointed=None, adapters: bool = False, cached: bool = True) -> int:
    """Each layer's four rows (its parts), appended to `rows`; the id of the last layer's output. `checkpointed`:
    the layers full checkpointing recomputes (None: all of them); the others run as without checkpointing.
    `adapters`: LoRA's (the base weights are frozen: autocast caches only the adapters' casts). `cached`: whether
    autocast's cache can hold the trained weights' casts at all: not under FSDP1 (parallel.fsdp_version 1), whose
    forward sets each module's weights to plain views of the unsharded flat parameter (_flat_param.py
    FlatParamHandle._use_unsharded_views(as_params=False), with use_orig_params or without), and autocast's
    cached_cast caches only a leaf that is no view (aten/src/ATen/autocast_mode.cpp `can_try_cache`: `arg.is_leaf()
    && !arg.is_view()`); under FSDP2 it does: fully_shard's unsharded parameter is an nn.Parameter made of an
    as_strided view of the all-gather output (_fsdp_param.py init_unsharded_param), and nn.Parameter detaches it, a
    leaf that is no view."""
    kept_bytes = _kept_bytes
    fam, flights, enc_flights, dense_flights, early, a2a = k.fam, k.flights, k.enc_flights, k.dense_flights, k.early, k.a2a
    redone, enc_redone = k.redone, k.enc_redone
    kernel, arrived = k.kernel, k.arrived
    b = sizes["b"]
    split_cache: dict = {}
    for i in range(n_layers):
        key = id(every[i])
        if key not in split_cache:
            parts = layer_parts(every[i], fam)
            # (per part: its kept bytes, those kept by the time its last adapter's flight comes, whether it routes,
            # those of its kept tensors made from its last LoRA linear's output on (models/held.py): not yet made at
            # that linear's worst forward op, freed again by its backward)
            split_cache[key] = (parts, [sum(kept_bytes(k) for k in kept) for _, kept in parts],
                                [sum(kept_bytes(k) for k in kept[:_through_last_adapter(kept)]) for _, kept in parts],
                                [any(k.label.startswith("router") for k in kept) for _, kept in parts],
                                any(k.label.startswith("grouped_mm") for k in every[i]),
                                [0 if stacked else sum(kept_bytes(t) for t in held.unmade_at_flight(part, fam.mlp, kept[_through_last_adapter(kept):]))
                                 for part, kept in parts],
                                {} if stacked or checkpointing != "full" else checkpointed_flights(cfg, parts, hidden, cached))
        parts, part_bytes, adapted_bytes, routers, grouped, unmade_bytes, nograd = split_cache[key]
        # a MoE model's dense layers (mlp_only_layers, decoder_sparse_step) run Llama's MLP: its flights
        sparse = not sizes.get("k") or grouped
        encoder = i < encoder_layers
        layer_hidden = enc_hidden if encoder else hidden
        boundary = _boundary_kept(parts[0][1], layer_hidden) if parts else layer_hidden  # the input, if kept as it is
        if stacked and i == encoder_layers:
            # the decoder's first layer reads the decoder's embeddings (b, target_len, h), not the encoder's output
            # (kept with the embeddings block for the cross-attention): under full checkpointing its boundary
            x = fresh(hidden)
        for n, (part, kept) in enumerate(parts):
            y = fresh(layer_hidden)
            row = weights(Row(f"layer {i} {part}", input=x, output=y), (i, part))
            redo = checkpointing == "full" and (checkpointed is None or i in checkpointed)
            if redo:
                # only the boundary (the layer's input) stays kept; backward recomputes the layer
                # first, and each part's tensors go when its backward is done
                row.kept = [x, *later_kept.get(i, ())] if n == 0 else []
                row.recompute = min(sum(part_bytes[: n + 1]) - boundary, bound[i])
                row.cast_cached = _cached_casts(kept, adapters) if row.grads and cached else 0
                layer_redone = enc_redone if encoder else redone
                if k.moe_tail and any(routers) and not encoder:
                    # a Llama 4, gpt-oss or Qwen MoE layer's recomputation (models/hf_act_flights._*_recompute_tail)
                    layer_redone = {p: max(f, k.moe_tail.get(p, 0)) for p, f in layer_redone.items()}
                if part in layer_redone:
                    # a LoRA linear's flight comes once its own tensors are kept, before what reads its output
                    row.recompute_moment = (min(sum(part_bytes[:n]) + adapted_bytes[n] - boundary, bound[i]), layer_redone[part])
                if (moments := (k.enc_kernel if encoder else kernel).get(part)):
                    # the math kernel's moments come after the LoRA linears' (their outputs summed): the worst of them
                    made = sum(part_bytes[: n + 1]) - boundary
                    for later, flight in moments:
                        later_bytes = sum(kept_bytes(k) for k in kept if later and k.label.startswith(later))
                        moment = (min(made - later_bytes, bound[i]), arrived + flight)
                        if row.recompute_moment is None or sum(moment) > sum(row.recompute_moment):
                            row.recompute_moment = moment
            else:
                row.kept = (kept_ids(kept, x, layer_hidden, b * enc_sizes["s"] if encoder else None) + later_kept.get(i, [])
                            if n == 0 else [fresh(kept_bytes(k)) for k in kept])
                # which op saved each (its label's prefix): what one autograd node unpacks
                row.kept_ops = [k.label.split(":")[0] for k in kept] + ["later"] * (len(row.kept) - len(kept))
            routed = a2a if part == "mlp" and routers[n] else 0
            row.forward_flight = layer_hidden + routed  # its output while it is written; its inner tensors are kept
            if redo and part in nograd:
                # a checkpointed part's forward saves nothing: its own worst moment, beside its unsaved input
                # (models.hf_nograd.checkpointed_flights)
                row.forward_flight = max(row.forward_flight, nograd[part] + routed)
            if part == "down_proj" and grouped and k.unsort and not encoder:
                # grouped experts: their unsort, before the layer's output exists (hf_act_flights._unsort_forward)
                row.forward_early = k.unsort
            unmade = unmade_bytes[n]
            if k.lora_forward.get(part) and not encoder:   # a LoRA linear's output, adapter output and sum (models/held.py)
                row.forward_flight = max(row.forward_flight, k.lora_forward[part] - unmade)
            if k.dora.get(part) and not encoder:
                row.forward_flight = max(row.forward_flight, k.dora[part])
            row.backward_flight = (enc_flights if encoder else (flights if sparse else dense_flights))[part] + routed
            if stacked:
                _t5_stack_ends(row, k, i, [q for q, _ in parts[: n + 1]], encoder_layers, n_layers)
            composed = [t for t in kept if t.label.startswith("act: ")] if part == "mlp" else []
            if len(composed) > 1:
                # an activation written as a chain of ops (GPT-2's gelu_new: 0.5 * x * (1 + tanh(...))): its backward
                # holds an intermediate product beside the incoming gradient and the one it makes (traced: MemTracker
                # peaks at a mul of that chain in GPT-2's recomputed layer 0, three (T, i) gradients)
                row.backward_flight += kept_bytes(composed[0])
            dequantized = (k.dequantized if sparse else k.dense_dequantized).get(part, 0) if not encoder else 0
            if dequantized:   # a 4-bit linear's dequantized weight beside the part's gradients (models/held.py)
                row.backward_flight = max(row.backward_flight, row.backward_flight + dequantized - unmade)
            row.early_flight = early.get(part) if not encoder else None
            if k.freed and part == "attention":
                # measured (MemTracker with a dispatch-mode tracer, T5 at its encoder's self-attention backward): by
                # the softmax's backward, p @ v's backward has freed what only it kept (its copy of v)
                row.flight_freed = sum(kept_bytes(t) for t in kept if t.label.startswith(k.freed))
            # a MoE layer's backward peaks at its unsort, before the experts' weight gradients exist; a dense MLP's at
            # its activation's backward (act * up's: the gradients of down_proj's input, of gate's and of up's outputs),
            # an attention's at its kernel's, before the linears they read from run theirs (their weight gradients
            # come later in the backward; measured: Qwen2 32-true, every second layer checkpointed, MemTracker peaks at
            # act * up's backward in layer 0 with neither gate_proj's nor up_proj's gradient made)
            moe_layer = bool(sizes.get("k")) and sparse
            # (a MoE layer's MLP part is the gate_up grouped_mm's backward, which makes its weight gradients itself)
            row.flight_first = part in (("down_proj", "attention") if moe_layer else FLIGHT_BEFORE_WEIGHTS)
            if row.flight_first and part in FLIGHT_BEFORE_WEIGHTS and row.grads:
                # its first linear's backward: one weight gradient made, the kernel's (the activation's) saved tensors
                # freed by its own backward
                freed = sum(kept_bytes(t) for t in kept if t.label.startswith(FLIGHT_OPS[part]))
                row.after_flight = (max(row.grads), (k.enc_after if encoder else k.after)[part], freed)
            rows.append(row)
            x = y
    return x


def _fsdp(config) -> bool:
    """Whether autocast's cache holds no weight cast (_layer_rows): the run shards with FSDP1 (parallel.fsdp with
    parallel.fsdp_version 1; FSDP2's unsharded parameters are leaves, not views, and their casts are cached: both
    measured, tests/ledger/test_fsdp_cast_cache.py), or splits its layers into pipeline stages, whose engines
    (Megatron's, DeepSpeed's) run no autocast (and where one autocast wraps a schedule its cache would live through the
    backward too: not measured, not priced)."""
    p = config.parallel
    return bool(p is not None and ((p.fsdp and p.fsdp_version == 1) or p.pipeline > 1))


def _adds_to(again: list, kept: list) -> bool:
    """Whether a layer's recomputed tensors (`again`) are its un-checkpointed ones (`kept`) with more, in the same
    order (labels a subsequence of `again`'s)."""
    labels = iter(k.label for k in again)
    return len(again) > len(kept) and all(k.label in labels for k in kept)


CAST = "weight, cast to the low dtype by autocast"   # models.hf_act_ops' label of a linear's weight cast


def _cached_casts(kept: list, adapters: bool) -> int:
    """Bytes of a checkpointed part's weight casts autocast's cache holds to the forward's end (Row.cast_cached):
    those its un-checkpointed run keeps, of the weights that train (a leaf that requires grad: under LoRA only the
    adapters'; a frozen weight is cast anew by each call, not cached)."""
    return sum(_kept_bytes(k) for k in kept if k.label.endswith(CAST) and (not adapters or ".lora_" in k.label))


# The parts of a dense layer whose worst backward moment (their flight) comes before the weight gradients of their
# parameters: the MLP's activation backward ahead of gate/up (fc_in), the attention kernel's ahead of q, k, v and the norm
FLIGHT_BEFORE_WEIGHTS = ("mlp", "attention")
# the ops at those flights, by the labels of what they keep (models.hf_act_*): act * up (a plain MLP's activation), the
# attention kernel
FLIGHT_OPS = {"mlp": ("act * up:", "act:", "act_fn(gate), * up:"), "attention": ("attention:",)}


def _base_name(name: str) -> str:
    """A parameter's transformers name under peft's wrapping (base_model.model.<name>, .base_layer., adapters)."""
    name = name[len("base_model.model."):] if name.startswith("base_model.model.") else name
    return name.replace(".base_layer.", ".")


# A layer's parameters by part, from their names (the families' spellings); the first match wins.
_PARTS = (
    ("o_proj", ("o_proj", "attn.c_proj", "attention.dense", "attention.output.", "Attention.o.")),
    ("attention", ("attn", "attention", "input_layernorm", "ln_1", "q_norm", "k_norm", "Attention.", "layer.0.layer_norm")),
    ("down_proj", ("down_proj", "mlp.c_proj", "dense_4h_to_h", ".output.", "DenseReluDense.wo")),
    ("mlp", ("",)),
)


def _part(name: str) -> str:
    return next(part for part, words in _PARTS if any(w in name for w in words))


def _through_last_adapter(kept: list) -> int:
    """How many of a part's kept tensors exist when its last LoRA linear runs: through its lora_B's input
    (all of them where the part has no adapter)."""
    last = [n for n, k in enumerate(kept) if ".lora_B: " in k.label]
    return last[-1] + 1 if last else len(kept)


