"""One real FSDP1 training step per rank (torch's FullyShardedDataParallel, gloo on CPU) of a tiny transformers Llama
under bf16 CPU autocast with transformers' gradient checkpointing, reporting MemTracker's peak of each phase.

Run as a script by tests/ledger/test_fsdp_cast_cache.py under a hard timeout:
    python tests/support/fsdp1_cast_worker.py WORLD OUT.json ACCUMULATION USE_ORIG_PARAMS(0|1) CACHE(0|1)
(CACHE: autocast's cache_enabled)
Each decoder layer is its own FSDP unit (transformer_auto_wrap_policy, as transformers' Trainer wraps it); SGD over
the FSDP module's parameters; two warm steps, then MemTracker (its module tracker off: FSDP1's forward swaps the
modules' parameters for views of the flat parameter, on which MemTracker's module hooks cannot be registered; every
byte is still counted by its dispatch mode) around the third, its peak noted per phase, and the forward's worst
moment by the innermost module running (the worker's own forward hooks on the model's modules, registered before FSDP
wraps them: they allocate nothing).
"""

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from gloo_ranks import fork_ranks  # noqa: E402

MICRO_BATCH, SEQ_LEN, LAYERS = 2, 32, 4


def config(vocab: int | None = None) -> dict:
    """The tiny Llama; `vocab` (or the environment's FSDP_WORKER_VOCAB, which the test sets for the workers): a
    vocabulary other than the tiny one's, making the root unit (embeddings, final norm, head) large against a layer."""
    import hf_measure

    vocab = vocab or int(os.environ.get("FSDP_WORKER_VOCAB", "0"))
    extra = {"vocab_size": vocab} if vocab else {}
    return hf_measure.without_attention_dropout(hf_measure.tiny("llama", num_hidden_layers=LAYERS, **extra))


def body(rank, world, accumulation, orig, cache):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    import hf_measure
    import peak_reference as ref

    running = []  # the modules whose forward is running, innermost last

    class Phases(ref.PhaseTracker):
        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            now = self._curr_mem_snap[ref.CPU]["Total"]
            if self.phase == "forward":
                inner = running[-1] if running else ""
                self.by_module[inner] = max(self.by_module.get(inner, 0), now)
            if now > self.peaks.get(self.phase, 0):
                self.peaks[self.phase] = now
                self.at_peak[self.phase] = {getattr(k, "value", k): v for k, v in self._curr_mem_snap[ref.CPU].items() if v}

    cfg = config()
    model = hf_measure.build(cfg, "sdpa", "32-true", None)
    model.activation_checkpointing_enable()
    for name, module in model.named_modules():
        if name:
            module.register_forward_pre_hook(lambda m, a, name=name: running.append(name) and None)
            module.register_forward_hook(lambda m, a, o, name=name: running.pop() and None)
    # what autocast would cache of a plain module's weights: a bf16 cast of every checkpointed layer's linear weight
    # (all trained: leaves that require a gradient)
    casts = 2 * sum(m.weight.numel() for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=orig, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=False)
    batch = hf_measure.inputs(cfg, MICRO_BATCH, SEQ_LEN, seed=1 + rank)
    x, y = batch["input_ids"], batch["labels"]

    tracker = Phases(model.parameters())
    tracker.peaks, tracker.at_peak, tracker.by_module = {}, {}, {}
    # the loss (transformers computes it in the model's forward, after the head): its own phase, as memfit's timeline
    head = model.module.lm_head if hasattr(model, "module") else model.lm_head
    head.register_forward_hook(lambda *_: setattr(tracker, "phase", "loss"))
    tracker = ref.warm_step(model, opt, x, y, accumulation,
                            lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache), tracker, modules=False)
    return {"peaks": tracker.peaks, "bytes": tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"],
            "phase": tracker.peak_phase, "casts": casts, "at_peak": tracker.at_peak, "by_module": tracker.by_module}


if __name__ == "__main__":
    world, out, accumulation, orig, cache = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1",
                                             sys.argv[5] == "1")
    fork_ranks(world, out, body, accumulation, orig, cache, preload=("transformers", "hf_measure", "peak_reference"))
