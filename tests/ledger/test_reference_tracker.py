"""The references are not moved by MemTracker's module tracker: the peak they measure with it (as they run) is the one
a step without it has, within 0.5% and in the same phase, for a covering sample of the reference configs.

MemTracker's module tracker (ModTracker) is not neutral: its pre-forward hook, register_multi_grad_hook in "all" mode,
closes over the inputs' grad_fns (a leaf input's AccumulateGrad, which holds the leaf, among them) and is stored on
them, a reference cycle per module call, and buffers each input's gradient until all of the module's inputs have
theirs; under DoRA that kept 296,960 B of garbage alive (tests/ledger/test_dora_peak.py, whose reference runs without
it: peak_reference.unhooked_step). A loop without the tracker holds none of that. Without it (peak_reference.NoModules)
MemTracker's dispatch mode still counts every byte: the untracked figure is the truth, and this pins that the tracked
one, which the other references report, equals it. The sample: Llama, GPT-2, Qwen3 and Mixtral; full, LoRA and QLoRA;
32-true, bf16-true and bf16-mixed; checkpointing none and full; each reference helper (peak_reference.measure_hf:
test_peak_transformers and, the same step, test_timeline_memtracker; test_combinations.measure_transformer;
test_eval_families.measured_evaluation).

Measured (torch 2.13, transformers 5.24, peft 0.21.2; tests/support/tracker_audit.py prints the table) over 59
reference configs (those four families' 16 measure_hf runs, their 25 covering-design runs, 18 evaluation passes):
every peak equal to the byte, in the same phase. What the tracker holds there, away from every peak: Mixtral's experts
module takes the routing weights and the hidden states, and the "all"-mode hook holds the routing weights' (fp32) gradient
(512 B at 2 x 32 tokens, 1,024 B at 2 x 64) until the hidden states' gradient arrives; with checkpointing enabled
(transformers' enable_input_require_grads makes the embeddings' output a leaf that requires grad) the evaluation
pass's first layer hooks that leaf, which the tracked pass then holds from the base model's return through the head
and the loss to its last op (262,144 B at 8 x 128: +14% of the live bytes there). That leaf is what moved one reference: under
gradient accumulation (tests/ledger/test_lora_input_copy.py, LoRA, full checkpointing, two micro-batches) micro-batch
1's leaf and its gradient stayed alive through micro-batch 2, 32,768 B (2.2-2.6%) above the untracked peak: that
reference now runs without the tracker (test_the_module_tracker_keeps_a_leaf_input_alive pins why). The only ops one
run makes and the other does not are the tracked run's aten.view (register_multi_grad_hook's view_as of a leaf input).
"""

from __future__ import annotations

import contextlib
import gc
import weakref

import needs
import pytest

torch = needs.module("torch")
needs.module("transformers")
needs.module("peft")
needs.module("bitsandbytes")

import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

BAND = 0.005
EVAL_LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
NF4 = {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
# test_combinations' runs (their ids), each measured the way that design measures it
COMBINATIONS = [
    "qwen3-32-true-full-lora-adamw8bit-foreach-peft-chunked_loss",
    "gpt2-bf16-true-full-qlora-bf16-adamw-fused-model-optimizer_in_backward",
    "gpt2-bf16-mixed-none-lora-adamw8bit-foreach-peft-none",
]


def _combination(run_id: str):
    import test_combinations as tc

    (run,) = [r for r in tc.RUNS if tc._id(r) == run_id]

    def measure():
        saved = hf_measure.measure
        hf_measure.measure = lambda *a, **k: {"peak": 0}   # (the saved activations: no MemTracker in them)
        try:
            tc.measure_transformer(hf_measure.without_attention_dropout(hf_measure.tiny(run["model"])), run)
        finally:
            hf_measure.measure = saved

    return measure


def _peak_hf(family: str, precision: str, checkpointing: str):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny(family))
    return lambda: ref.measure_hf(cfg, micro_batch=2, seq_len=64, optimizer="adamw", impl="foreach", checkpointing=checkpointing,
                                  precision=precision)


def _evaluation(family: str, precision: str = "32-true", checkpointing: bool = False, lora: dict | None = None,
                quantization: dict | None = None):
    """test_eval_families' pass at its evaluation batch (8 x 128)."""
    import test_eval_families as te

    cfg = te._config(family)
    return lambda: te.measured_evaluation(cfg, te.MICRO, te.EVAL, te.SEQ, precision, checkpointing, lora, quantization)


CASES = {
    # test_peak_transformers' and test_timeline_memtracker's step (MoE: the experts' two inputs)
    "peak mixtral 32-true none": lambda: _peak_hf("mixtral", "32-true", "none"),
    **{f"combination {r}": (lambda r=r: _combination(r)) for r in COMBINATIONS},
    # test_checkpointed_runs_evaluate_without_checkpointing's (the tracker holds the embedding's output through the loss)
    "evaluation llama checkpointed": lambda: _evaluation("llama", checkpointing=True),
    # test_lora_and_qlora_evaluation_passes_match_memtracker's QLoRA
    "evaluation llama qlora bf16-true": lambda: _evaluation("llama", "bf16-true", lora=EVAL_LORA, quantization=NF4),
}


def _tracked(measure, modules: bool):
    with ref.audited(modules) as made:
        measure()
    tracker = made[-1]
    return {"bytes": tracker._peak_mem[ref.CPU], "phase": tracker.peak_phase, "trace": tracker.trace}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", list(CASES))
def test_the_module_tracker_moves_no_reference(case):
    measure = CASES[case]()
    on, off = _tracked(measure, True), _tracked(measure, False)
    print(f"{case}: module tracker on {on['bytes']:,} ({on['phase']}), off {off['bytes']:,} ({off['phase']})")
    assert abs(on["bytes"] - off["bytes"]) <= BAND * off["bytes"], (on["bytes"], off["bytes"])
    assert on["phase"] == off["phase"]
    both = ref.aligned_live(on["trace"], off["trace"])
    apart = [(op, a - b) for op, a, b in both if a != b]
    print(f"  {len(both)} ops in both, the live bytes apart at {len(apart)}: {max((d for _, d in apart), key=abs, default=0):+,} B at most")
    assert len(both) == len(off["trace"]), "an op of the untracked step the tracked one does not make"
    made_on = [op for op, _ in on["trace"]]
    for op, _, _ in both:   # what is left of the tracked run's ops: its own views, which allocate nothing
        made_on.remove(op)
    assert set(made_on) <= {"aten.view.default"}, set(made_on)


def test_the_module_tracker_keeps_a_leaf_input_alive():
    """Why a reference whose module input is a leaf that requires grad (the embeddings' output under checkpointing)
    runs without ModTracker: its pre-forward hook's register_multi_grad_hook closes over the leaf's AccumulateGrad,
    which holds the leaf, and registers that closure on the leaf itself; the cycle passes through the autograd node,
    which Python's collector cannot see, so the leaf and its .grad outlive the loop's last reference (a loop without
    the tracker frees them). Strict: if torch stops holding them, this fails and the references may be tracked again."""
    from torch.distributed._tools.mod_tracker import ModTracker

    def alive_after(tracker) -> tuple:
        torch.manual_seed(0)
        linear = torch.nn.Linear(4, 4)
        x = torch.randn(2, 4).requires_grad_()
        with tracker():
            loss = linear(x).sum()
            loss.backward()
        refs = weakref.ref(x), weakref.ref(x.grad)
        del loss, x
        gc.collect()
        return tuple(r() is not None for r in refs)

    assert alive_after(contextlib.nullcontext) == (False, False)
    assert alive_after(ModTracker) == (True, True)
