"""A transformers layer's kept tensors (models.hf_activations' rows, resolved) as its four parts in forward order:
the attention (its norm, projections and kernel), o_proj, the MLP and down_proj. The ledger prices a layer's rows
by these parts (ledger/training.py) and the evaluation pass's no-grad moments are described by them
(models/hf_nograd.py)."""

from __future__ import annotations


def layer_parts(kept: list, fam) -> list:
    """A layer's kept tensors as its four parts, in forward order (a part that keeps nothing of
    its own, such as o_proj whose input the attention kernel keeps, is empty). A part begins at
    the first label of its first op."""
    n = fam.names
    routed = any(k.label.startswith("grouped_mm") for k in kept)  # a mixture of experts' layer
    # hf_activations names an op by its role (o_proj, fc_out, ...) or by the family's module
    starts_with = {
        "o_proj": ("o_proj", n["o"]),
        # (Cohere's gate/up input is the attention's, kept there: its MLP part begins at the activation)
        # (Falcon's one-norm layout likewise: its MLP part begins at the activation; ln_mlp: the new architecture's)
        "mlp": ("post_attention_layernorm", "ln_mlp", "gate_proj", "gate_up_proj", "fc_in", "act_fn(gate)", "act: ",
                *(n[k] for k in ("gate", "gate_up", "fc_in") if k in n)),
        # (a mixture of experts' grouped MLP: from the activation on, whose kept tensors its backward frees before
        # the gate_up grouped_mm's)
        "down_proj": ("down_proj", "fc_out", "act_fn(gate), * up" if routed else "grouped_mm down",
                      *(n[k] for k in ("down", "fc_out") if k in n)),
    }
    order = ["attention", "o_proj", "mlp", "down_proj"]
    starts = [0] * len(order) + [len(kept)]
    for i in range(len(order) - 1, 0, -1):
        found = next((m for m, k in enumerate(kept) if k.label.startswith(starts_with[order[i]])), None)
        starts[i] = min(found if found is not None else starts[i + 1], starts[i + 1])
    return [(part, kept[starts[i] : starts[i + 1]]) for i, part in enumerate(order)]
