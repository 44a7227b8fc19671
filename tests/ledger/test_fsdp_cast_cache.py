"""Autocast's cast cache under PyTorch FSDP, measured, FSDP1 (`parallel: {fsdp: ..., fsdp_version: 1}`) and FSDP2
(`fsdp_version: 2`, the default).

FSDP1's forward sets each module's parameters to plain views of the unsharded flat parameter
(torch/distributed/fsdp/_flat_param.py, FlatParamHandle._use_unsharded_views(as_params=False), with use_orig_params and
without), and autocast's cached_cast caches only a leaf that is no view (aten/src/ATen/autocast_mode.cpp
`can_try_cache`), so the checkpointed layers' weight casts are not held to the forward's end there (ledger/training.py
_layer_rows `cached`, Row.cast_cached). FSDP2's unsharded parameter is an nn.Parameter made of an as_strided view of
the all-gather output (torch/distributed/fsdp/_fully_shard/_fsdp_param.py init_unsharded_param); nn.Parameter
detaches it: a leaf, no view, fp32 and requiring a gradient (the worker reports what `can_try_cache` reads of a
layer's weight in its forward), so autocast caches its casts as without FSDP.

The reference: a warm step of the real run (2 gloo ranks on CPU, tiny Llama full fine-tune, bf16 CPU autocast,
transformers' gradient checkpointing; tests/support/fsdp1_cast_worker.py under MemTracker,
tests/support/fsdp2_cast_worker.py under FSDPMemTracker), with autocast's cache on and off, the loss (after the head,
in the model's forward) its own phase. memfit's figures are `memfit explain --format json`'s timeline on the config
file, its forward's and its loss's worst moments.

FSDP1: the forward's peak is the same with the cache off (it holds nothing): 660,672 B, inside the last layer (the
sharded parameters 304,256 B, the root's and the layer's unsharded flat parameters 65,792 + 135,680 B, the program
154,880 B). memfit's forward was 802,496 B (141,824 above): 135,680 B of it FSDP2's all-gather output beside the
gathered unit (one layer's fp32 parameters: FSDP2 keeps a unit's all-gather output until the next unit's copy-out;
FSDP1 all-gathers into the flat parameter and prefetches nothing in forward); the other 6,144 B are two moments
compared: memfit's worst is the head's post-forward (the logits written, the root and the largest unit counted
gathered, where FSDP1 holds the root only), while inside the last layer memfit's walk counted 592,832 B, its program
87,040 B, 67,840 B under the real one's there (the checkpointed layer's forward temporaries, not FSDP's: now priced,
660,416 B, test_fsdp1_checkpointed_layer_forward). Its loss was 732,868 B against 597,976 B: there FSDP1 holds the root
unit only (65,792 B), the last layer resharded. With fsdp_version 1: forward 666,816 B (1.009; 660,416 B, 0.9996,
with the root alone at the head and the checkpointed layer's own moment), loss 597,188 B (0.9987: the 788 B the
loss's program is under without FSDP too). Its backward's peak 1,148,872 B: memfit's was 1,331,520 B with FSDP2's
reduce-scatter input kept beside the next unit's backward, which FSDP1 has not (it reduce-scatters the flat gradient
itself): 1,195,840 B (1.041); 1,150,656 B (1.0016) with the shards of the units reduced only.
FSDP2: the cache holds the casts (forward 1,049,792 B with it, 847,040 B without, 202,752 B: the three layers' casts
cached before the peak). The peak is the last layer's all-gather copy-out: `wait_for_unshard` has dropped the previous
layer's all-gather output from `comm_ctx.all_gather_state` but its local `prev_all_gather_state` holds it until it
returns, so the root's parameters, the previous layer's output, the layer's own and its unsharded parameters are live
(65,792 + 3 x 135,680 B). memfit's forward without the cache (as every parallel.fsdp run was priced before
fsdp_version) was 802,496 B, 0.764 of the real one; with it 1,072,832 B (1.022, its worst moment the head's, a unit
above the real head's: the last layer resharded; 1,050,560 B, 1.0007, without that unit), its loss
1,003,204 B against 1,002,968 B (1.0002), and the layer's pre-forward, where memfit now counts that previous output
(ledger/ranks.py _FsdpUnits.copy_out), 1,050,560 B against the peak's 1,049,792 B (1.0007; 914,880 B before it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")

import fsdp1_cast_worker as worker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(worker.__file__))
WORLD = 2
# the loss's moment, FSDP2's copy-out and a checkpointed layer's forward: memfit within this fraction of MemTracker's
# (its program is 788 B under the real one's at the loss, with FSDP or without, 256 B in a layer); a layer's
# all-gather output (135,680 B) is far outside it
LOSS_BAND = 0.005


def _run(tmp_path, version: int, *args: int, vocab: int = 0) -> dict:
    out = tmp_path / f"fsdp{version}-{'-'.join(map(str, args))}-{vocab}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", FSDP_WORKER_VOCAB=str(vocab))
    script = os.path.join(HERE, f"fsdp{version}_cast_worker.py")
    done = subprocess.run([sys.executable, script, str(WORLD), str(out), "1", *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text())[0]


def _memfit(tmp_path, version: int | None, vocab: int = 0) -> dict:
    """memfit's worst moment of the forward and of the loss (`memfit explain --format json`'s timeline), on the run as
    a config file, and the warm step's timeline; `version`: parallel.fsdp_version (None: not written, the default);
    `vocab`: the tiny Llama's vocabulary (0: its own)."""
    (tmp_path / "config.json").write_text(json.dumps(worker.config(vocab or None)))
    parallel = {"data": WORLD, "fsdp": "full_shard", **({"fsdp_version": version} if version else {})}
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "model": {"hf_config": "config.json"},
           "precision": "bf16-mixed", "optimizer": "sgd",
           "training": {"micro_batch": worker.MICRO_BATCH, "seq_len": worker.SEQ_LEN, "attention": "sdpa",
                        "checkpointing": "full", "optimizer_impl": "for_loop"},
           "parallel": parallel}
    path = tmp_path / f"run-{version}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    timeline = json.loads(done.stdout)["files"][0]["timeline"]
    worst = {phase: max(e["bytes"] for e in timeline if e["phase"] == phase) for phase in ("forward", "loss", "backward")}
    return {**worst, "timeline": [e for e in timeline if e["step"] == 2]}


def _loss_within_band(ours: int, theirs: int, label: str) -> None:
    assert abs(ours - theirs) <= LOSS_BAND * theirs, f"{label}: memfit's loss {ours:,} against MemTracker's {theirs:,}"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("use_orig_params", [True, False])
def test_fsdp1_forward_holds_no_cast_cache(use_orig_params, tmp_path):
    cached, uncached = _run(tmp_path, 1, int(use_orig_params), 1), _run(tmp_path, 1, int(use_orig_params), 0)
    # the real run: autocast's cache holds nothing under FSDP1 (the same forward peak with it off)
    assert cached["peaks"]["forward"] == uncached["peaks"]["forward"], (cached, uncached)
    ours = _memfit(tmp_path, 1)
    theirs = cached["peaks"]["forward"]
    print(f"FSDP1 use_orig_params={use_orig_params}: memfit forward {ours['forward']:,} / MemTracker {theirs:,}, "
          f"loss {ours['loss']:,} / {cached['peaks']['loss']:,} (casts a cache would hold {cached['casts']:,})")
    # the forward's peak, in the last layer (test_fsdp1_checkpointed_layer_forward): 256 B under, the position ids;
    # the casts a cache would hold (270,336 B) far outside the band
    assert abs(ours["forward"] - theirs) <= LOSS_BAND * theirs < cached["casts"], \
        f"forward {ours['forward']:,} against MemTracker's {theirs:,} (the cast cache: {cached['casts']:,})"
    _loss_within_band(ours["loss"], cached["peaks"]["loss"], "FSDP1")
    # the head: the last layer resharded by its post-forward, the root alone gathered (memfit counted the largest
    # unit too: 666,816 B against MemTracker's 531,392 B)
    head = max(e["bytes"] for e in ours["timeline"] if e["module"] == "lm_head" and e["phase"] == "forward")
    print(f"FSDP1 lm_head: memfit {head:,} / MemTracker {cached['by_module']['lm_head']:,}")
    _loss_within_band(head, cached["by_module"]["lm_head"], "FSDP1's head")
    # the backward: FSDP1 keeps no reduce-scatter input beside the next unit's backward (it reduce-scatters the unit's
    # flat gradient itself): memfit was 1,331,520 B against 1,148,872 B with FSDP2's; then 1,195,840 B (1.041), its
    # gradients' shares counted for the root's and the running layer's gradients too, which the rank holds unsharded
    # only until their reduce-scatter (ledger/ranks.py _FsdpUnits.sharded): at the peak, in the second layer's
    # backward, MemTracker's live storages hold the shards of the two layers reduced (67,840 B each), the root's and
    # that layer's gradients whole
    back = cached["peaks"]["backward"]
    print(f"FSDP1 backward: memfit {ours['backward']:,} / MemTracker {back:,}")
    assert back <= ours["backward"] <= (1 + LOSS_BAND) * back, f"backward {ours['backward']:,} against MemTracker's {back:,}"


@pytest.mark.filterwarnings("ignore")
def test_fsdp2_forward_holds_the_cast_cache(tmp_path):
    cached, uncached = _run(tmp_path, 2, 1), _run(tmp_path, 2, 0)
    # what autocast's can_try_cache reads of a layer's weight in its forward under fully_shard: a leaf, no view
    assert cached["weight"] == {"leaf": True, "view": False, "fp32": True, "requires_grad": True, "dtensor": False,
                                "shape": [worker.config()["hidden_size"]] * 2}, cached["weight"]
    # the real run: the cache holds the casts (the forward's peak is higher with it on)
    held = cached["peaks"]["forward"] - uncached["peaks"]["forward"]
    assert held > 0, (cached["peaks"], uncached["peaks"])
    ours = _memfit(tmp_path, None)  # fsdp_version left out: FSDP2
    theirs = cached["peaks"]["forward"]
    print(f"FSDP2: memfit forward {ours['forward']:,} / MemTracker {theirs:,} (cache off {uncached['peaks']['forward']:,}), "
          f"loss {ours['loss']:,} / {cached['peaks']['loss']:,} (casts {cached['casts']:,})")
    assert ours["forward"] >= theirs, f"forward {ours['forward']:,} below MemTracker's {theirs:,}: the cast cache not counted?"
    assert ours["forward"] - theirs < held, f"forward {ours['forward']:,} above MemTracker's {theirs:,} by more than the cache holds"
    _loss_within_band(ours["loss"], cached["peaks"]["loss"], "FSDP2")
    # the real forward's peak: a layer's all-gather copy-out (in the layer, before any of its modules runs), the
    # previous layer's all-gather output still held beside its own and its unsharded parameters; memfit's instant
    # there is the layer's pre-forward
    at = cached["at_peak"]["forward"]
    assert at["module"].startswith("model.layers.") and at["module"].count(".") == 2, at
    moment = next(e["bytes"] for e in ours["timeline"] if e["module"] == at["module"] and e["at"] == "pre-forward")
    print(f"FSDP2 {at['module']}'s copy-out: memfit {moment:,} / FSDPMemTracker {theirs:,}")
    assert theirs <= moment <= (1 + LOSS_BAND) * theirs, f"{at['module']}'s pre-forward {moment:,} against {theirs:,}"
    # the head: the last layer resharded, its all-gather output kept (no later copy-out drops it) beside the root's
    # parameters (memfit counted the largest unit gathered too: 1,072,832 B, a unit above FSDPMemTracker's 936,384 B)
    head = max(e["bytes"] for e in ours["timeline"] if e["module"] == "lm_head" and e["phase"] == "forward")
    print(f"FSDP2 lm_head: memfit {head:,} / FSDPMemTracker {cached['by_module']['lm_head']:,}")
    assert cached["by_module"]["lm_head"] <= head <= (1 + LOSS_BAND) * cached["by_module"]["lm_head"], head
    # the backward: the shards of the layers reduce-scattered only (memfit was 1,331,520 B against 1,283,528 B, the
    # root's and the running layer's gradients counted whole and as shares)
    back = cached["peaks"]["backward"]
    print(f"FSDP2 backward: memfit {ours['backward']:,} / FSDPMemTracker {back:,}")
    assert back <= ours["backward"] <= (1 + LOSS_BAND) * back, f"backward {ours['backward']:,} against {back:,}"


# a vocabulary large against the layers: the root unit (embeddings, final norm, head: 4,194,560 B) 31 times a layer
# (135,680 B)
LARGE_VOCAB = 8192


@pytest.mark.filterwarnings("ignore")
def test_fsdp2_embeddings_hold_the_roots_all_gather_output(tmp_path):
    """FSDP2's root is all-gathered at its pre-forward, before the embeddings run: the root's parameters and its
    all-gather output are held through the embeddings (that output until the first layer's copy-out). memfit's
    forward counted the largest unit gathered and its output there (6,856,128 B against FSDPMemTracker's
    10,774,208 B, 0.636); with the root's own it is within the band, and the forward's peak (the first layer's
    copy-out, the root's output still held) as before."""
    real = _run(tmp_path, 2, 1, 1, vocab=LARGE_VOCAB)
    ours = _memfit(tmp_path, None, vocab=LARGE_VOCAB)
    theirs = real["by_module"]["model.embed_tokens"]
    moment = max(e["bytes"] for e in ours["timeline"] if e["module"] == "model.embed_tokens" and e["phase"] == "forward")
    print(f"FSDP2 vocab {LARGE_VOCAB}: embeddings memfit {moment:,} / FSDPMemTracker {theirs:,}; forward "
          f"{ours['forward']:,} / {real['peaks']['forward']:,}; loss {ours['loss']:,} / {real['peaks']['loss']:,}")
    assert theirs <= moment <= (1 + LOSS_BAND) * theirs, f"the embeddings' moment {moment:,} against {theirs:,}"
    assert real["peaks"]["forward"] <= ours["forward"] <= (1 + LOSS_BAND) * real["peaks"]["forward"], \
        f"forward {ours['forward']:,} against {real['peaks']['forward']:,}"
    _loss_within_band(ours["loss"], real["peaks"]["loss"], "FSDP2, a large vocabulary")


@pytest.mark.filterwarnings("ignore")
def test_fsdp1_checkpointed_layer_forward(tmp_path):
    """Under FSDP1 with autocast caching nothing, the forward's real peak is inside the last checkpointed layer: its
    MLP's up projection (the worker's module hooks and a dispatch trace of MemTracker's live storages there,
    660,672 B: the sharded parameters 304,256 B, the root's and the layer's flat parameters 65,792 + 135,680 B, the
    four layers' inputs, the residual after the attention and the MLP norm's fp32 output (16,384 B each), the
    activation's output, the up projection's weight cast and output (14,336 B each) and its input's cast (8,192 B);
    not FSDP's: torch.utils.checkpoint's non-reentrant forward saves nothing, so the part's tensors go as soon as
    no name holds them). memfit's worst moment of that layer was its post-forward, 609,216 B (a checkpointed part
    priced as its output written); with the MLP part's own worst moment (models/hf_nograd.py checkpointed_flights:
    the up projection's call where no weight cast is cached) 660,416 B, 256 B under: the position ids
    (modeling_llama.py LlamaModel.forward, `torch.arange(...) + past_seen_tokens`, (1, s) int64), held through the
    model's forward and not counted by memfit in any run (the same 256 B under without FSDP)."""
    real = _run(tmp_path, 1, 1, 0)
    ours = _memfit(tmp_path, 1)
    last = f"model.layers.{worker.LAYERS - 1}"
    theirs = max(b for m, b in real["by_module"].items() if m == last or m.startswith(last + "."))
    moment = max(e["bytes"] for e in ours["timeline"] if e["module"] == last and e["phase"] == "forward")
    print(f"FSDP1 {last}'s forward: memfit {moment:,} / MemTracker {theirs:,} (the forward's peak {real['peaks']['forward']:,})")
    assert abs(moment - theirs) <= LOSS_BAND * theirs, f"{last}'s forward moment {moment:,} against MemTracker's {theirs:,}"


@pytest.mark.filterwarnings("ignore")
def test_fsdp2_large_vocab_backward_beside_gloos_copy(tmp_path):
    """FSDP2's backward with a vocabulary of 8,192: the real peak (15,223,624 B) is the root unit's reduce-scatter,
    where FSDPMemTracker counts its input (the root's padded gradients, 4,194,560 B) and, among the temporaries, gloo's
    own clone of it: ProcessGroupGloo::reduce_scatter_tensor_coalesced (torch/csrc/distributed/c10d/
    ProcessGroupGloo.cpp, reached from dist.reduce_scatter_single through _reduce_scatter_base) clones each input and
    all-reduces the clone; ProcessGroupNCCL::_reduce_scatter_base reduces from the input in place
    (ncclReduceScatter(input.data_ptr(), output.data_ptr(), ...)). The copy is gloo's (a CPU run's), not a GPU run's:
    memfit does not price it. The worker computes its bytes from torch's own code (foreach_reduce's padded input
    sizes, fsdp2_cast_worker.gloo_copy). memfit's backward (14,015,684 B, its worst moment the loss's backward) is
    then between what the real rank holds there without gloo's copy (11,029,064 B: a lower bound of an NCCL run's
    peak) and the gloo run's peak (0.921 of it)."""
    real = _run(tmp_path, 2, 1, 1, vocab=LARGE_VOCAB)
    ours = _memfit(tmp_path, None, vocab=LARGE_VOCAB)
    copy, peak, at = real["gloo_copy"], real["peaks"]["backward"], real["at_peak"]["backward"]
    print(f"FSDP2 vocab {LARGE_VOCAB} backward: memfit {ours['backward']:,} / FSDPMemTracker {peak:,}, gloo's copy {copy:,} "
          f"(at the peak: reduce-scatter input {at.get('Reduce Scatter', 0):,}, temporaries {at.get('Temp', 0):,})")
    # the peak is the root's reduce-scatter: its input, the size gloo clones, and the clone among the temporaries
    assert copy > 0 and at.get("Reduce Scatter") == copy and at.get("Temp", 0) >= copy, (copy, at)
    assert peak - copy <= ours["backward"] < peak, f"backward {ours['backward']:,} against {peak:,} less gloo's copy {copy:,}"
