"""The passes beside a run's training step (ledger/passes.py) wired into the check: the distillation teacher's
step built from its own model section (`training.teacher`), the evaluation pass's step at `training.eval_batch`.
Both for a transformer on one device; elsewhere a note at the key says the figure leaves the pass out."""

from __future__ import annotations

from dataclasses import replace

from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem

# the training keys of checkpointing, which the evaluation pass's no-grad forward does not do
CHECKPOINT_KEYS = ("checkpointing", "checkpoint_every", "checkpoint_offset")


def _transformer(config) -> bool:
    model = getattr(config, "model", None)
    return model is not None and hasattr(model, "cfg")


def unplaced(config, training: dict) -> list:
    """The notes for the passes a layout (or a model that is not a transformer) leaves out of the figure."""
    out = []
    why = "under a parallel layout" if config.parallel is not None else "for a model that is not a transformer"
    if "teacher" in training and (config.parallel is not None or not _transformer(config)):
        out.append(Problem(("training", "teacher"), codes.NOT_MODELLED, f"training.teacher {why}: the teacher's weights and forward are not modelled, the figure is low by them", severity=codes.INFORMATION, on_key=True))
    if "eval_batch" in training and (config.parallel is not None or not _transformer(config)):
        out.append(Problem(("training", "eval_batch"), codes.NOT_MODELLED, f"training.eval_batch {why}: the evaluation pass is not modelled, the figure may be low for it", severity=codes.INFORMATION, on_key=True))
    return out


def teacher(config, data: dict, step, optimizer, impl: str, path: str) -> tuple:
    """The step with the teacher's weights, forward and KD loss (ledger.passes.with_teacher), and the problems of the
    teacher's model section (positioned under training.teacher)."""
    from memfit.ledger import passes, training
    from memfit.models.dispatch import derive

    section = data["training"]["teacher"]
    doc = {k: v for k, v in data.items() if k not in ("lora", "quantization", "model")}
    doc["model"] = dict(section)
    doc["training"] = {k: v for k, v in data["training"].items() if k not in ("teacher", "eval_batch")}
    emitted, found = derive(doc, config, path)
    problems = [replace(p, path=("training", "teacher", *p.path[1:])) if p.path[:1] == ("model",) else p for p in found]
    if any(p.level == codes.ERROR for p in problems) or emitted.model is None or not hasattr(emitted.model, "cfg"):
        if not problems:
            problems.append(Problem(("training", "teacher"), codes.NEEDS_TRANSFORMER, "training.teacher: the teacher is a transformer (hf_config or transformer)", on_key=True))
        return step, problems
    own = replace(config, model=emitted.model, tensors=tuple(t for t in config.tensors if not t.path or t.path[0] != "model") + tuple(emitted.tensors))
    taught = training.build(own, doc, optimizer, impl)
    run, cfg = config.model.training, config.model.cfg
    loss = data["training"].get("loss")
    chunks = int(loss.get("chunks") or 8) if isinstance(loss, dict) and loss.get("kind") == "chunked" else 1
    problems = [p for p in problems if p.level == codes.INFORMATION]
    return passes.with_teacher(step, taught, run["micro_batch"], run["seq_len"], cfg.get("vocab_size") or 0, chunks), problems


def evaluation(config, data: dict, peak: dict, optimizer, impl: str) -> dict:
    """The run's peak with the evaluation pass at training.eval_batch (ledger.passes.with_evaluation)."""
    from memfit.ledger import passes, training

    train = data["training"]
    # (a model in eval() under no_grad does not checkpoint: transformers' gradient checkpointing runs only while
    # self.training and grad is enabled, and saved-tensor hooks (activation offloading) see nothing to save, so the
    # evaluation forward is the one without either, where its no-grad forward is described (models.hf_nograd); where it
    # is not, the rows stay as the step runs them: a checkpointed model's are its boundaries, not every saved tensor at once)
    model = config.model._replace(training={**config.model.training, "micro_batch": train["eval_batch"], "checkpointing": "none"})
    nograd = _nograd(model)
    skipped = ("teacher", "eval_batch", *CHECKPOINT_KEYS, "activation_offloading") if nograd is not None else ("teacher", "eval_batch")
    if nograd is None:
        model = config.model._replace(training={**config.model.training, "micro_batch": train["eval_batch"]})
    doc = {**data, "training": {k: v for k, v in train.items() if k not in skipped}}
    doc["training"]["micro_batch"] = train["eval_batch"]
    from memfit.ledger.step import rounded

    step = training.build(replace(config, model=model), doc, optimizer, impl)
    keep = train.get("keep_gradients") is True
    found = passes.evaluation_pass(step, keep, nograd)
    if config.granule:  # as step.peak: what rounding each live tensor up to the allocator's granule adds, as overhead
        extra = passes.evaluation_pass(rounded(step, config.granule), keep, nograd)["bytes"] - found["bytes"]
        found["live"]["overhead"] += extra
        found["bytes"] += extra
        found["granularity"] = extra
    return passes.with_evaluation(peak, found)


def _nograd(model):
    """What the model's no-grad forward holds beside the step's rows (models.hf_nograd), as ledger.passes.NoGrad;
    None where that is not described (an encoder-decoder, an encoder, a technique's own layout)."""
    from memfit.ledger.passes import NoGrad
    from memfit.ledger.training import layer_parts
    from memfit.models import hf_activations as acts, hf_nograd
    from memfit.models.hf_act_eval import layer_sizes, role_dtypes
    from memfit.models.hf_act_families import FAMILIES
    from memfit.models.hf_act_flights import lora_forward_flights
    from memfit.recipe.costs import dtype_bytes

    run, recipe_args = model.training, dict(getattr(model, "recipe", None) or {})
    precision = recipe_args.get("precision", "32-true")
    blocks = acts.saved(model.cfg, micro_batch=run["micro_batch"], seq_len=run["seq_len"], attention=run["attention"],
                        checkpointing="none", dtypes=model.dtypes, **recipe_args)
    fam = FAMILIES.get(model.cfg.get("model_type"))
    if fam is None or model.cfg.get("qwen_vl"):
        # (a Qwen-VL's vision tower is its embeddings row: its no-grad forward, one tower layer at a time, is not
        # described, and the row's saved tensors all at once would price every tower layer together)
        return None
    layers = [layer_parts(blk.kept, fam) for blk in blocks[1:-2] for _ in range(blk.count)]
    unsaved = None
    if recipe_args.get("lora") is not None:
        # a frozen base saves less (nothing for its weights' gradients), but its no-grad forward makes the same
        # tensors: described from the rows of the base as trained, with what the frozen rows leave out added back
        trained = acts.saved(model.cfg, micro_batch=run["micro_batch"], seq_len=run["seq_len"], attention=run["attention"],
                             checkpointing="none", dtypes=model.dtypes, **{**recipe_args, "lora": None})
        full = [layer_parts(blk.kept, fam) for blk in trained[1:-2] for _ in range(blk.count)]
        sizes, roles = layer_sizes(model.cfg, run["micro_batch"], run["seq_len"], attention=run["attention"]), role_dtypes(precision, model.dtypes)
        hidden = dtype_bytes(sizes["b"] * sizes["s"] * sizes["h"], roles["act"])
        quantized, mixed = bool((model.dtypes or {}).get("quantized")), precision.endswith("-mixed")
        flights = lora_forward_flights(model.cfg, sizes, recipe_args["lora"], roles, quantized, mixed)
        unsaved = [hf_nograd.frozen_unsaved(a, b, hidden, roles["lin"], flights) for a, b in zip(full, layers)]
        adapted, layers = layers, full
    found = hf_nograd.nograd_held(model.cfg, run["micro_batch"], run["seq_len"], run["attention"], precision, model.dtypes, layers,
                                  adapted if unsaved is not None else None)
    if found is None:
        return None
    if unsaved is not None:
        found["parts"] = [{p: d.get(p, 0) + u.get(p, 0) for p in {*d, *u}} for d, u in zip(found["parts"], unsaved)]
        # autocast caches a cast of a weight that requires grad only: the adapters', not the frozen base's
        found["casts"] = hf_nograd.weight_casts(adapted, trained_only=True)
    # the head's weight cast (its row is blocks[-2], the final norm's and the head's), cached to the forward's end
    # where the head trains: the loss runs inside the forward, labels given
    found["head_cast"] = sum(hf_nograd.weight_casts([[("head", blocks[-2].kept)]], trained_only=unsaved is not None)[0].values())
    return NoGrad(**found)
