"""training.softmax_saves_input and training.attention_mask_fp32, measured: torch before 1.11 kept each softmax's input
for backward beside its output (tools/autograd/derivatives.yaml at v1.10.0, `_softmax(Tensor self, int dim, bool
half_to_float)`: `self: _softmax_backward_data(grad, result, dim, self)`; pytorch/pytorch#66018 passes only the input's
dtype, from 1.11 on). The reference emulates that rule on today's torch: the real tiny BERT (eager attention) with
`nn.functional.softmax` replaced by an autograd Function that saves input and output and runs the same backward, its
saved tensors counted by saved_tensors_hooks (hf_measure.measure), against `memfit check` on the config file. The fp32
mask: the same BERT given a padding attention_mask, which transformers turns into an additive mask in the
embeddings' dtype (fp32 under autocast) and adds to the bf16 scores, promoting them (as 4.15's extended mask did even
when no mask was given)."""

from __future__ import annotations

import json
import subprocess
import sys

import needs
import pytest
import yaml

torch = needs.module("torch")
needs.module("transformers")

import hf_measure  # noqa: E402
from bert_reserve import Softmax110  # noqa: E402  (torch 1.10's softmax: its input saved beside its output)

MICRO_BATCH, SEQ_LEN = 2, 32


def softmax_110(x, dim=None, _stacklevel=3, dtype=None):
    return Softmax110.apply(x if dtype is None else x.to(dtype), dim)


class Masked(torch.nn.Module):
    """The model called with an attention_mask that pads the first sample's last token: transformers 5 builds an
    additive (b, 1, s, s) mask in the embeddings' dtype from it (fp32 under autocast; an all-ones mask it drops)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, labels):
        mask = torch.ones_like(input_ids)
        mask[0, -1] = 0
        return self.inner(input_ids=input_ids, labels=labels, attention_mask=mask)


def saved(precision: str, old: bool, mask: bool) -> int:
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("bert"))
    model = hf_measure.build(cfg, "eager", precision)
    if mask:
        model = Masked(model)
    original = torch.nn.functional.softmax
    if old:
        torch.nn.functional.softmax = softmax_110
    try:
        return hf_measure.measure(cfg, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, attention="eager", precision=precision,
                                  model=model)["peak"]
    finally:
        torch.nn.functional.softmax = original


def memfit(precision: str, old: bool, mask: bool, tmp_path) -> int:
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("bert"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    training = {"micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "attention": "eager"}
    if old:
        training["softmax_saves_input"] = True
    if mask:
        training["attention_mask_fp32"] = True
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "model": {"hf_config": "config.json"},
           "precision": precision, "optimizer": "adamw", "training": training}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]["footprint"]["activations"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision, mask", [("32-true", False), ("bf16-mixed", False), ("bf16-mixed", True)])
def test_the_old_softmax_keeps_its_input(precision, mask, tmp_path):
    today, old = saved(precision, False, mask), saved(precision, True, mask)
    ours_today, ours_old = memfit(precision, False, mask, tmp_path), memfit(precision, True, mask, tmp_path)
    print(f"{precision} mask {mask}: saved_tensors_hooks {today:,} -> {old:,} (+{old - today:,}); "
          f"memfit {ours_today:,} -> {ours_old:,} (+{ours_old - ours_today:,})")
    assert old > today
    assert ours_old - ours_today == old - today   # one scores tensor per layer, in the dtype it has
    assert abs(ours_old - old) <= 0.05 * old
