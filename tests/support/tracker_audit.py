"""The audit behind tests/ledger/test_reference_tracker.py: each reference helper's MemTracker peak with its module
tracker on (as the references run) and off (peak_reference.NoModules, the collector as the references leave it), over
the reference configs of Llama, GPT-2, Qwen3 and Mixtral (or the families named), one row each: the peak both ways,
their difference, the phase both ways, and the live bytes after the ops both runs make (how many differ, the largest
difference). For reading, not a test (minutes):

    cd tests/ledger && PYTHONPATH=../../src:../support:../../tools:. python ../support/tracker_audit.py [peak|comb|eval|warm] [families]
"""

from __future__ import annotations

import gc
import sys

import hf_measure
import peak_reference as ref

FAMILIES = ("llama", "gpt2", "qwen3", "mixtral")


def both(measure) -> dict:
    """{True: ..., False: ...}: the last PhaseTracker's peak, phase and trace with the module tracker on, then off."""
    out = {}
    for modules in (True, False):
        gc.collect()
        with ref.audited(modules) as made:
            measure()
        tracker = made[-1]
        out[modules] = {"bytes": tracker._peak_mem[ref.CPU], "phase": tracker.peak_phase, "trace": tracker.trace}
    return out


def row(name: str, out: dict) -> str:
    on, off = out[True], out[False]
    apart = [a - b for _, a, b in ref.aligned_live(on["trace"], off["trace"]) if a != b]
    d = on["bytes"] - off["bytes"]
    return (f"| {name} | {on['bytes']:,} | {off['bytes']:,} | {d:+,} | {100 * d / off['bytes']:+.3f}% | {on['phase']} / {off['phase']} "
            f"| {len(apart)} of {len(off['trace'])} ops, {max(apart, key=abs, default=0):+,} B |")


def _cfg(family: str) -> dict:
    return hf_measure.without_attention_dropout(hf_measure.tiny(family))


def peak_hf(families) -> list:
    """test_peak_transformers' step (test_timeline_memtracker's, fp32): AdamW foreach, 2 x 64."""
    return [(f"measure_hf {f} {p} checkpointing {c}",
             lambda f=f, p=p, c=c: ref.measure_hf(_cfg(f), micro_batch=2, seq_len=64, optimizer="adamw", impl="foreach", checkpointing=c,
                                                  precision=p))
            for f in families for p in ("32-true", "bf16-true") for c in ("none", "full")]


def combinations(families) -> list:
    """test_combinations' covering design's runs of these families (their MemTracker step, not the saved bytes)."""
    import test_combinations as tc

    def measure(run):
        saved = hf_measure.measure
        hf_measure.measure = lambda *a, **k: {"peak": 0}
        try:
            tc.measure_transformer(_cfg(run["model"]), run)
        finally:
            hf_measure.measure = saved

    return [(f"combination {tc._id(r)}", lambda r=r: measure(r)) for r in tc.RUNS if r["model"] in families and not tc.refused(r)]


def evaluations(families) -> list:
    """test_eval_families' passes at 8 x 128: each family plain, and the checkpointed, adapted and bf16-mixed LoRA ones."""
    import test_eval_families as te

    def at(family, *args):
        cfg = te._config(family)
        return lambda: te.measured_evaluation(cfg, te.MICRO, te.EVAL, te.SEQ, *args)

    cases = [(f"evaluation {f}", at(f)) for f in families]
    cases += [(f"evaluation {f} checkpointed", at(f, "32-true", True)) for f in te.CHECKPOINTED]
    for name, (precision, quantization) in te.ADAPTED.items():
        family = name if name in hf_measure.TINY else name.rsplit("_", 1)[0]
        cases.append((f"evaluation {name} adapted {precision}", at(family, precision, False, te.LORA, quantization)))
    cases += [(f"evaluation {f} LoRA bf16-mixed", at(f, "bf16-mixed", False, te.LORA)) for f in ("llama", "mixtral")]
    return cases


def warm_steps(families) -> list:
    """peak_reference.warm_step's references under autocast with full checkpointing: test_lora_input_copy's (LoRA, now
    measured untracked: the table shows why) and test_autocast_cache's (full fine-tuning), one and two micro-batches."""
    import test_autocast_cache as ac
    import test_lora_input_copy as li

    cases = [(f"lora_input_copy {m} {o} accumulation {a}", lambda m=m, o=o, a=a: li.measure(m, o, a))
             for m in ("llama", "qwen2") for o in ("sgd", "adamw") for a in (1, 2)]
    cases += [(f"autocast_cache {m} accumulation {a}", lambda m=m, a=a: ac.measure(m, a)) for m in ("llama", "bert") for a in (1, 2)]
    return cases + [("autocast_cache llama every 2 accumulation 2", lambda: ac.measure("llama", 2, every=2))]


if __name__ == "__main__":
    kinds = {"peak": peak_hf, "comb": combinations, "eval": evaluations, "warm": warm_steps}
    chosen = [sys.argv[1]] if len(sys.argv) > 1 else list(kinds)
    families = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else FAMILIES
    print("| config | peak, module tracker on | off | on - off | % | phase on / off | live bytes apart at the ops both make |")
    print("|---|---:|---:|---:|---:|---|---|")
    for kind in chosen:
        for name, measure in kinds[kind](families):
            print(row(name, both(measure)), flush=True)
