"""Activation offloading: saved-tensor hooks copy what the forward saves for backward to host memory and bring each
tensor back when the backward needs it (torchtune's `enable_activation_offloading`, training/_activation_offloading.py
OffloadActivations; Axolotl's `activation_offloading`). What stays on the device, as that class does it (commit
05cda5e9, use_streams=True, its default on torch >= 2.5):
- what the forward saves under min_offload_size (1024 bytes; pack_tensor: `num_bytes >= self.min_tensor_size_bytes`);
- the input batch (the training loop holds it whatever is saved);
- the forward stash: an offloaded tensor stays referenced until a tensor max_fwd_stash_size (5) ids later is
  offloaded (every saved tensor takes an id), and those still there when the backward starts are used as they are
  until the first node of the body's backward has run, which empties the stash (`stash`, `_with_stash`);
- what the forward references by a local besides its saved slot: the model's inputs_embeds and rotary cos and sin,
  each decoder layer's residual (`referenced`);
- the output layer's saved tensors and the loss's: torchtune's recipes run model.output under NoOpManager
  (get_act_offloading_ctx_manager) and the loss outside the context (_loss_step): the last row and the loss keep
  theirs;
- while a row runs its forward, its own tensors (they are made there); while it runs its backward, the tensors it
  keeps, brought back (a checkpointed layer's: its input, brought back for the recomputation, through its backward);
- a weight's transposed view is packed like an activation (it is not an nn.Parameter instance: pack_tensor's test),
  so the backward brings a copy of each weight back for its node, kept until the next node's hook has run
  (unpack_tensor_with_streams' prev_node_ids): two consecutive nodes' tensors, an op's or a weight's, in flight during
  its backward (`_weight_copies`; not in a checkpointed layer: its ops save under torch.utils.checkpoint's own
  hooks, the innermost, so only the checkpoint's inputs reach OffloadActivations).
The host holds every offloaded copy at the end of the forward (Step.offloaded's bytes, `host_bytes`).
Measured on the CPU with that code's pack/unpack ported to saved_tensors_hooks (tests/support/offload_reference.py):
tests/ledger/test_activation_offloading.py.
"""

from __future__ import annotations

from dataclasses import replace

NAME = "activation_offloading"

MIN_OFFLOAD_SIZE = 1024   # OffloadActivations(min_offload_size=1024)
MAX_FWD_STASH_SIZE = 5    # OffloadActivations(max_fwd_stash_size=5)

KEYS = {
    "activation_offloading": {
        "title": "Activation offloading",
        "description": "true: what the forward saves for backward is copied to host memory and brought back when the "
                       "backward needs it (torchtune's enable_activation_offloading, Axolotl's activation_offloading), "
                       "with OffloadActivations' window on the device: tensors under 1,024 bytes, the offloaded ones among the last 5 saved (until the first backward node), what the forward references by a local, "
                       "the output layer's and the loss's, and each row's own while it runs. Default false.",
        "type": "boolean",
        "default": False,
    },
}


def applies(training: dict) -> bool:
    return training.get("activation_offloading") is True


def problems(config, training: dict) -> list:
    return []


def offloaded(step) -> list:
    """The ids the hooks copy to the host, in the order they are packed (forward order): every tensor of at least
    min_offload_size the model's body saves (the forward stash's too: `stash`)."""
    size, batch = step.tensors, set(step.batch)
    order: list = []
    seen: set = set()
    for row in step.rows[:-1]:   # the output layer runs under NoOpManager
        for t in row.kept:
            if t in seen or t in batch:
                continue
            seen.add(t)
            if size[t] >= MIN_OFFLOAD_SIZE:
                order.append(t)
    return order


def stash(step, order: list) -> list:
    """The offloaded ids the forward stash still holds on the device when the backward starts. pack_tensor numbers
    every tensor it is handed (`self.tensor_id += 1`, the small ones and the weights it leaves on the device too)
    and an offloaded one leaves the stash once a tensor max_fwd_stash_size ids later is offloaded: those among the
    last max_fwd_stash_size saved tensors of the body stay. Counted over the program's saved tensors (one per
    storage a row keeps): the weights a matmul saves and a tensor saved again by a later op take ids of their own
    that the rows do not list, so the real window holds as many or fewer (the safe side)."""
    batch, order_set = set(step.batch), set(order)
    saved: list = []
    seen: set = set()
    for row in step.rows[:-1]:
        for t in row.kept:
            if t not in seen and t not in batch:
                seen.add(t)
                saved.append(t)
    return [t for t in saved[-MAX_FWD_STASH_SIZE:] if t in order_set]


def host_bytes(step) -> int:
    """What the host holds at the end of the forward: pack_tensor copies every tensor of at least min_offload_size
    the model's body saves (`torch.empty_like(activation, pin_memory=..., device="cpu")`), the ones the forward
    stash still holds on the device and the batch's included; each storage once (the class copies a storage once per
    op that saves it: a tensor saved by several ops, q, k and v's input, is on the host several times, which the
    program's rows, one id per storage, do not say: this is the least the host holds)."""
    if not step.offloaded:
        return 0
    size, seen, total = step.tensors, set(), 0
    for row in step.rows[:-1]:
        for t in row.kept:
            if t not in seen and size[t] >= MIN_OFFLOAD_SIZE:
                seen.add(t)
                total += size[t]
    return total


def host(config) -> dict | None:
    """The host memory of the most-loaded node: what the layout offloads (placement: parameters, gradients, optimizer
    state) and the saved activations this technique moved there, each GPU's process its own (the binding rank's
    program, times the GPUs of a node). None when nothing is on the host."""
    placement = getattr(config, "placement", None)
    base = placement.host if placement is not None else None
    step = getattr(config, "step", None)
    moved = host_bytes(step) if step is not None and getattr(step, "offloaded", None) else 0
    if not moved:
        return base
    if base is not None:
        gpus = base["gpus"]
    elif getattr(config, "parallel", None) is not None and placement is not None and placement.sharded is not None:
        gpus = min(config.parallel.gpus_per_node, placement.sharded.ranks)
    else:
        gpus = 1
    held = dict(base) if base is not None else {"parameters": 0, "gradients": 0, "optimizer_state": 0, "gpus": gpus}
    held["activations"] = moved * gpus
    held["total"] = sum(v for k, v in held.items() if k not in ("total", "gpus"))
    return held


def referenced(step, moved: set) -> list:
    """Bytes each row's forward moment holds beyond what the walk counts once saved tensors leave: tensors the
    forward references by a Python local, not only by a saved slot, stay on the device whether or not the hooks
    copied them out (issue 32: a dispatch-mode trace of Cohere QLoRA under bf16-mixed at MemTracker's forward
    peak). transformers' decoder models (modeling_llama.py LlamaModel.forward, modeling_cohere.py 396-415 alike):
    `inputs_embeds` (the embeddings' output) and `position_embeddings` (the rotary cos and sin) are locals of the
    model's forward while every layer runs; a decoder layer holds `residual = hidden_states` (its input,
    modeling_cohere.py 324 and 338; modeling_llama.py 296 and 311: the input, then the attention's sum) while its
    parts run. A row that keeps the layer's input itself counts it among its own offloaded tensors already."""
    size, rows = step.tensors, step.rows
    out = [0] * len(rows)
    first = next((n for n, row in enumerate(rows) if row.name == "embeddings"), None)
    if first is None:
        return out
    emb, kept = rows[first], {t for row in rows for t in row.kept}
    # the embeddings' output and its offloaded tensors (cos, sin): kept on the device by the model's forward
    model_locals = [t for t in {emb.output, *emb.kept} if t is not None and (t in moved or t not in kept)]
    layer_input: dict = {}
    for n, row in enumerate(rows[first + 1:], first + 1):
        if not row.name.startswith("layer "):
            continue
        layer = row.name.split()[1]
        residual = layer_input.setdefault(layer, row.input)
        held = sum(size[t] for t in model_locals if t not in row.kept)
        if residual is not None and residual not in row.kept and (residual in moved or residual not in kept):
            held += size[residual]
        out[n] = held
    return out


def _weight_copies(row, size: dict, off: set) -> int:
    """What the weights' copies add to a row's backward window beyond its two adjacent ops' tensors (ledger.step
    counts those): unpack_tensor_with_streams keeps what one autograd node brought back until the next node's hook
    has run (prev_node_ids), so two consecutive nodes' tensors are there at once, and a matmul's node brings back its
    weight's transposed view (a copy: pack_tensor offloads what is not an nn.Parameter instance). The most two
    consecutive nodes hold is two adjacent ops' tensors, an op's beside a weight, or two weights; the order of a
    row's weight nodes among its ops is not in the program, so the largest of each."""
    ops: list = []
    for t, op in zip(row.kept, row.kept_ops or [None] * len(row.kept)):
        nbytes = size[t] if t in off else 0
        if ops and ops[-1][0] == op and op is not None:
            ops[-1][1] += nbytes
        elif row.kept_ops:
            ops.append([op, nbytes])
        elif ops:
            ops[-1][1] += nbytes
        else:
            ops.append([None, nbytes])
    adjacent = max((ops[n][1] + (ops[n + 1][1] if n + 1 < len(ops) else 0) for n in range(len(ops))), default=0)
    widest = max((b for _, b in ops), default=0)
    weights = sorted(row.params + row.frozen, reverse=True)[:2] + [0, 0]
    return max(adjacent, widest + weights[0], weights[0] + weights[1]) - adjacent


def _moving(row, kept: set, off: set) -> list:
    """The row's input and output ids the walk counts as its forward transients (not saved on the device)."""
    return [t for t in {row.input, row.output} if t is not None and (t not in kept or t in off)]


def _with_stash(rows: list, size: dict, kept: set, off: set, stashed: list) -> list:
    """The forward stash on the device (OffloadActivations.pack_tensor's fwd_stash, `del self.fwd_stash[id]` only
    once max_fwd_stash_size later ids are packed): a stashed tensor is there from the row that saves it through the
    forward, the head and the loss, and the backward of the output layer and of the body's last row; that row's
    first node's hook empties the stash (unpack_tensor_with_streams' hook: `for id in self.fwd_stash: del`), so from
    there on a stashed tensor comes back from the host for its own row's backward like any offloaded one."""
    first = {}
    for n, row in enumerate(rows):
        for t in row.kept:
            first.setdefault(t, n)
    out = []
    last_body = len(rows) - 2
    for n, row in enumerate(rows):
        alive = sum(size[t] for t in stashed if first.get(t, n) < n and t not in row.kept)
        if alive:
            if row.forward_flight is None:
                own = set(row.kept) & off
                moving = sum(size[t] for t in _moving(row, kept, off) if t not in own)
                row = replace(row, forward_flight=moving + (0 if row.inner_kept else row.inner) + alive)
            else:
                row = replace(row, forward_flight=row.forward_flight + alive)
            if row.forward_early is not None:
                row = replace(row, forward_early=row.forward_early + alive)
        if n >= last_body:   # the output layer's backward and the body's last row's: the stash is still there
            still = sum(size[t] for t in stashed if t not in row.kept)
            if row.backward_flight is not None:
                row = replace(row, backward_flight=row.backward_flight + still)
            else:
                row = replace(row, backward_extra=row.backward_extra + still)
            if row.early_flight is not None:
                row = replace(row, early_flight=row.early_flight + still)
        out.append(row)
    return out


def rewrite(step, config, training: dict):
    moved = offloaded(step)
    if not moved:
        return step
    rows = []
    moved_set = set(moved)
    held = referenced(step, moved_set)
    for n, row in enumerate(step.rows[:-1]):
        if held[n] and row.forward_flight is not None:
            row = replace(row, forward_flight=row.forward_flight + held[n])
        if held[n] and row.forward_early is not None:
            row = replace(row, forward_early=row.forward_early + held[n])
        # (a checkpointed row's ops save under the checkpoint's own hooks, the innermost: no weight is packed)
        # (a matmul saves its weight only for its input's gradient: none where the row makes none, as an embedding)
        back = _weight_copies(row, step.tensors, moved_set) if row.grad_input and not row.recompute and any(t in moved_set for t in row.kept) else 0
        if row.backward_flight is not None:
            row = replace(row, backward_flight=row.backward_flight + back)
        else:
            row = replace(row, backward_extra=row.backward_extra + back)
        rows.append(row)
    stashed = stash(step, moved)
    kept = {t for row in step.rows for t in row.kept}
    rows = _with_stash(rows + step.rows[-1:], step.tensors, kept, moved_set, stashed)
    at_loss = sum(step.tensors[t] for t in stashed)
    loss = replace(step.loss, forward=(*step.loss.forward, at_loss), backward=(*step.loss.backward, at_loss))
    return replace(step, rows=rows, offloaded=moved_set, loss=loss)
