"""Not a test: the arithmetic behind docs/accuracy.md's open lead on the A100 table's 4-bit rows (Lit-GPT 8641822).

At 8641822 `finetune/lora.py` keeps `loss` a tensor and rebinds `logits` only when the next forward returns, so the
first micro-batch's graph (the longest sample, 1,304 tokens for Llama 2, 1,034 for StableLM) lives through the second
micro-batch's forward and loss, and with it every 4-bit matmul input bitsandbytes 0.41.1 keeps on `ctx.tensors`.
This prints, for each 4-bit row, what memfit gives for the second micro-batch at a few lengths: memfit's own step with
`training.previous_outputs_held` at that length, less the held inputs it prices at that length, plus those inputs at
the first micro-batch's length (one bf16 storage a token per 4-bit part: the attention's input and output, the MLP's
input and its down projection's input; layer 0's attention input needs no grad; the head's input, ln_f's output, is
added). It is an estimate of a candidate, not a figure memfit claims: the second sample's length is not known.

    PYTHONPATH=src python tests/support/litgpt_iteration1_arithmetic.py
"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parent / "published"
# row: (published GB, hidden, intermediate, layers, first micro-batch's tokens, llama layout)
ROWS = {
    "llama2-7b-nf4-b1": (14.14, 4096, 11008, 32, 1304, True),
    "llama2-7b-nf4-dq-b1": (13.84, 4096, 11008, 32, 1304, True),
    "llama2-13b-nf4-b1": (23.14, 5120, 13824, 40, 1304, True),
    "llama2-13b-nf4-dq-b1": (22.55, 5120, 13824, 40, 1304, True),
    "stablelm-3b-nf4-b1": (6.35, 4096, 16384, 16, 1034, False),
    "stablelm-3b-nf4-dq-b1": (6.19, 4096, 16384, 16, 1034, False),
}
LENGTHS = (600, 800, 1000, 1100, 1200, 1250)


def peak(path: Path) -> int:
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                         capture_output=True, text=True, check=False).stdout
    return json.loads(out)["files"][0]["peak"]["bytes"]


def main() -> None:
    work = Path(tempfile.mkdtemp())
    for extra in list(PUBLISHED.glob("*.json")) + [PUBLISHED / "memfit.toml"]:
        shutil.copy(extra, work)
    for name, (published, hidden, inter, layers, first, llama) in ROWS.items():
        source = (PUBLISHED / f"litgpt-lora-{name}.yaml").read_text()
        per_token_layer = 2 * (3 * hidden + inter) if llama else 2 * 7 * hidden   # bytes: one bf16 storage per part
        priced = lambda t: t * (layers * per_token_layer - 2 * hidden)   # noqa: E731 (memfit's: no layer-0 attention input)
        held_first = first * layers * per_token_layer                    # the same, the head's input added
        figures = []
        for t in LENGTHS:
            text = re.sub(r"seq_len: \d+", f"seq_len: {t}", source)
            text = text.replace("training:\n", "training:\n  previous_outputs_held: true\n", 1)
            path = work / f"{name}-{t}.yaml"
            path.write_text(text)
            figures.append((t, (peak(path) - priced(t) + held_first) / 1e9))
        below = [(t, g) for t, g in figures if g <= published]
        above = [(t, g) for t, g in figures if g > published]
        at = None
        if below and above:
            (t0, g0), (t1, g1) = below[-1], above[0]
            at = t0 + (t1 - t0) * (published - g0) / (g1 - g0)
        print(json.dumps({"row": name, "published_GB": published, "held_first_GB": round(held_first / 1e9, 3),
                          "second_microbatch_GB": {t: round(g, 3) for t, g in figures},
                          "tokens_to_reach_published": None if at is None else round(at)}))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
