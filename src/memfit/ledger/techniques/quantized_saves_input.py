"""bitsandbytes before 0.43.2: each 4-bit matmul keeps its input for backward.

bitsandbytes' MatMul4Bit (bitsandbytes/autograd/_functions.py) is the autograd function of every Linear4bit (QLoRA's
base). Up to 0.43.1 its forward ends `if any(ctx.needs_input_grad[:2]): ctx.tensors = (A, B)`: the matmul's input A,
as Linear4bit.forward hands it over (`x.to(self.compute_dtype)`), held by the autograd node, though the backward reads
only B (`grad_A = torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state)...)`). 0.43.2 and later keep
`ctx.tensors = (None, B)` (0.50.2, the version memfit's tests run, line 358): that is what memfit models by default.
`training.quantized_saves_input: true` puts the older behaviour in the program: for each part of each layer whose
linears are 4-bit, the input they read, in the compute dtype, kept from that part's forward to its backward; unless that
storage is kept already:
- the same tensor kept by another op: o_proj's input is the attention kernel's own output (sdpa, flash) when it
  already is in the compute dtype; a LoRA adapter on one of the part's linears keeps the input itself when its
  dropout is 0 and its weights are in the input's dtype (peft: `lora_A(dropout(x))`, `x.to(lora_A.weight.dtype)` a
  no-op);
- otherwise it is one storage more; where the input is in another dtype than the compute dtype (the fp32 residual
  stream under autocast) each Linear4bit casts it itself (`x.to(self.compute_dtype)`): one copy per linear (q, k and
  v: three).
A frozen embedding (LoRA, no checkpointing) gives the first layer's attention an input without a gradient: nothing
is kept there (`any(ctx.needs_input_grad[:2])` is false).
The attribute is a Python attribute of the node, not a saved tensor: activation checkpointing does not drop it, and
saved_tensors_hooks do not see it (it is measured with MemTracker; tests/ledger/test_quantized_saves_input.py).
The compute dtype is taken as the dtype memfit's transformer runs its matmuls in (bnb_4bit_compute_dtype = the
model's dtype, or autocast's), as QLoRA is launched by Axolotl, LLaMA-Factory and LitGPT.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem
from memfit.recipe.costs import dtype_bytes

NAME = "quantized_saves_input"

KEYS = {
    "quantized_saves_input": {
        "title": "4-bit matmuls keep their input (bitsandbytes < 0.43.2)",
        "description": "true: each bitsandbytes 4-bit matmul keeps its input for backward, as bitsandbytes up to "
                       "0.43.1 did (MatMul4Bit.forward: ctx.tensors = (A, B)); 0.43.2 and later keep only the packed "
                       "weight, which is what memfit models by default. Set it for a QLoRA run on an older "
                       "bitsandbytes (LitGPT's 2023 measurements ran 0.41.1). Default false.",
        "type": "boolean",
        "default": False,
    },
}

# the linears of each part of a layer by their role in the family's module names (models.hf_activations Family.names)
PART_ROLES = {"attention": ("q", "k", "v", "qkv"), "o_proj": ("o",), "mlp": ("gate", "up", "gate_up", "fc_in"),
              "down_proj": ("down", "fc_out")}
# each part's input, by its size in hf_activations._sizes (the elements per token)
PART_INPUT = {"attention": "h", "o_proj": "q", "mlp": "h", "down_proj": "i"}


def applies(training: dict) -> bool:
    return training.get("quantized_saves_input") is True


def problems(config, training: dict) -> list:
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg") or (getattr(model, "dtypes", None) or {}).get("quantized") != "4bit":
        return [Problem(("training", "quantized_saves_input"), codes.IGNORED_KEY,
                        "training.quantized_saves_input: no 4-bit quantized transformer (quantization nf4 or fp4 on an "
                        "hf_config model): nothing keeps a 4-bit matmul's input", severity=codes.WARNING)]
    return []


def _targeted(lora: dict | None, name: str) -> bool:
    if not lora:
        return False
    targets = lora.get("target_modules")
    if targets == "all-linear":
        return True
    if isinstance(targets, str):
        targets = [targets]
    return any(name == t or name.endswith("." + t) for t in targets or ())


# precision -> (the activations' dtype, the matmuls' dtype: bnb_4bit_compute_dtype as QLoRA launchers set it)
DTYPES = {"32-true": ("float32", "float32"), "bf16-true": ("bfloat16", "bfloat16"), "16-true": ("float16", "float16"),
          "bf16-mixed": ("float32", "bfloat16"), "16-mixed": ("float32", "float16")}


def _dims(cfg: dict, tokens: int) -> dict:
    """A dense decoder's widths per token (hidden, attention output, MLP), and the tokens; {} for a mixture of experts
    (its grouped experts are no Linear4bit)."""
    from memfit.models.families import FAMILIES as SPECS

    spec = SPECS.get(cfg.get("model_type"))
    if spec is None:
        return {}
    h, heads = cfg.get(spec.hidden_key), cfg.get(spec.heads_key)
    if not h or not heads or cfg.get("num_experts_per_tok"):
        return {}
    # the MLP's width: intermediate_size, or the family's own key (Falcon's ffn_hidden_size), else 4 x hidden
    # (GPT-2 without n_inner)
    inter = cfg.get("intermediate_size") or (cfg.get(spec.ffn_default) if spec.ffn_default else None) or 4 * h
    return {"T": tokens, "h": h, "q": heads * (cfg.get("head_dim") or h // heads), "i": inter}


def extra_inputs(config, every: bool = False) -> dict:
    """{part: bytes} that each part of a layer keeps more (its 4-bit linears' input), from the model's own dims.
    `every`: each part's input even where another op keeps that storage too (what the nodes alone hold once the
    backward has freed the saved tensors: training.previous_outputs_held)."""
    from memfit.models import hf_activations as acts

    model = config.model
    cfg, run = model.cfg, model.training
    fam = acts.FAMILIES.get(cfg.get("model_type"))
    if fam is None:
        return {}
    recipe = dict(getattr(model, "recipe", None) or {})
    precision = recipe.get("precision", "32-true")
    act, compute = DTYPES.get(precision, DTYPES["32-true"])
    sizes = _dims(cfg, run["micro_batch"] * run["seq_len"])
    lora = recipe.get("lora") or {}
    adapter = (model.dtypes or {}).get("adapter") or "float32"
    dropout = float(lora.get("dropout") or 0)
    out = {}
    for part, part_roles in PART_ROLES.items():
        names = [fam.names[r] for r in part_roles if r in fam.names]
        if not names or not sizes.get(PART_INPUT[part]):
            continue
        given = act   # the dtype the part's input is in (under autocast the 4-bit base's outputs are cast back)
        copies = 1   # the part's linears read one storage
        if given != compute:
            copies = len(names)   # Linear4bit.forward casts its input itself: one copy per linear (measured)
        elif not every:
            if part == "o_proj" and run.get("attention") in ("sdpa", "flash"):
                continue   # the attention kernel keeps its output: the same storage
            if dropout == 0 and adapter == given and any(_targeted(lora, n) for n in names):
                continue   # the adapter's lora_A keeps the input itself
        out[part] = copies * dtype_bytes(sizes["T"] * sizes[PART_INPUT[part]], compute)
    return out


def rewrite(step, config, training: dict):
    model = getattr(config, "model", None)
    if model is None or not hasattr(model, "cfg") or (getattr(model, "dtypes", None) or {}).get("quantized") != "4bit":
        return step
    extra = extra_inputs(config)
    if not extra:
        return step
    tensors = dict(step.tensors)
    fresh = max(tensors) + 1
    rows = []
    # a frozen embedding's output needs no gradient (no full checkpointing): the first layer's first linears' input
    # does not either, and MatMul4Bit keeps nothing where no input needs a gradient (`any(ctx.needs_input_grad[:2])`)
    no_grad_in = bool(step.rows) and step.rows[0].name == "embeddings" and not step.rows[0].output_grad
    for row in step.rows:
        part = row.name.rsplit(" ", 1)[-1] if row.name.startswith("layer ") else None
        if part == "attention" and no_grad_in and row.name == "layer 0 attention":
            part = None
        if part in extra:
            tensors[fresh] = extra[part]
            ops = list(row.kept_ops) + ["MatMul4Bit"] if row.kept_ops else []
            row = replace(row, kept=[*row.kept, fresh], kept_ops=ops)
            fresh += 1
        rows.append(row)
    return replace(step, rows=rows, tensors=tensors)
