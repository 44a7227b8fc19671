"""Not a test: the measurement behind tests/support/litgpt_port.py and docs/accuracy.md's LitGPT attention table, on
LitGPT's own source. LitGPT's GPT with LoRA (8641822's lit_gpt/ or 3ba6da40's litgpt/, from a source tree; its
lightning imports stubbed, nothing else changed), tiny widths, bf16, one forward (lm_head_chunk_size=128) +
chunked_cross_entropy + backward under saved_tensors_hooks: the peak of the distinct saved storages (parameters and
buffers excluded), printed as JSON.

    git -C litgpt archive 3ba6da40 litgpt | tar -x -C /tmp/src3ba6   # or: archive 8641822 lit_gpt
    WIDTH=256 python litgpt_source_measure.py /tmp/src3ba6 3ba6da40 llama 4 q,v
    WIDTH=256 VOCAB=2048 python litgpt_source_measure.py /tmp/src3ba6 3ba6da40 neox 4 q,v   # StableLM's layout

Arguments: the source tree, the commit (8641822 or 3ba6da40), llama|neox, query groups, adapted parts; a sixth
argument lists each saved storage.

It runs unchanged under other torch versions: the A100 table's PyTorch 2.1.0 (a Python 3.11 venv with pip's
torch==2.1.0 and numpy<2, pyyaml for 3ba6da40's tree) keeps each norm's torch.mean input, which 2.2.0 and later do
not (docs/accuracy.md, "PyTorch 2.1's torch.mean"; tests/ledger/test_litgpt_qkv.py TORCH_2_1_SAVED):

    python3 -m venv /tmp/t21 && /tmp/t21/bin/pip install torch==2.1.0 'numpy<2' pyyaml
    WIDTH=256 VOCAB=2048 /tmp/t21/bin/python litgpt_source_measure.py /tmp/src8641 8641822 llama 4 q,v"""
import sys, types, json, weakref, os, importlib

WIDTH = int(os.environ.get("WIDTH", 64)); VOCAB = int(os.environ.get("VOCAB", 128)); INTER_L = int(WIDTH * 172 // 64); INTER_N = 4 * WIDTH


def import_litgpt(source: str, version: str):
    """LitGPT's lora and utils modules from the source tree, its lightning imports stubbed."""
    pkg = "lit_gpt" if version == "8641822" else "litgpt"
    sys.path.insert(0, source)
    for name in ["lightning", "lightning.fabric", "lightning.fabric.strategies", "lightning.fabric.utilities",
                 "lightning.fabric.utilities.load", "lightning.fabric.loggers", "lightning.pytorch",
                 "lightning.pytorch.loggers",
                 "lightning_utilities", "lightning_utilities.core", "lightning_utilities.core.imports", f"{pkg}.tokenizer",
                 f"{pkg}.prompts"]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["lightning.fabric.strategies"].FSDPStrategy = object
    sys.modules["lightning"].Fabric = object
    sys.modules["lightning"].LightningModule = object
    sys.modules["lightning.fabric.loggers"].CSVLogger = object
    sys.modules["lightning.pytorch.loggers"].WandbLogger = object
    sys.modules["lightning.fabric.loggers"].TensorBoardLogger = object
    sys.modules["lightning.fabric.utilities.load"]._lazy_load = None

    class RC:
        def __init__(self, req, *a): self.req = req
        def __bool__(self): return "flash" not in self.req
    sys.modules["lightning_utilities.core.imports"].RequirementCache = RC
    sys.modules[f"{pkg}.tokenizer"].Tokenizer = object
    sys.modules[f"{pkg}.prompts"].PromptStyle = object
    return importlib.import_module(f"{pkg}.lora"), importlib.import_module(f"{pkg}.utils")


def build(lora, version: str, kind: str, kv: int, parts, width: int = None, vocab: int = None, layers: int = 2,
          heads: int = 4, block_size: int = 256):
    """LitGPT's GPT with LoRA, bf16, only the adapters trainable."""
    import torch
    width = width or WIDTH; vocab = vocab or VOCAB
    common = dict(n_embd=width, n_head=heads, n_query_groups=kv, n_layer=layers, vocab_size=vocab,
                  padded_vocab_size=vocab, block_size=block_size,
                  **(dict(r=8, alpha=16, dropout=0.0, to_query="q" in parts, to_key="k" in parts, to_value="v" in parts)
                     if version == "8641822" else
                     dict(lora_r=8, lora_alpha=16, lora_dropout=0.0, lora_query="q" in parts, lora_key="k" in parts,
                          lora_value="v" in parts)))
    NORM, MLP = ("_norm_class", "_mlp_class") if version == "8641822" else ("norm_class_name", "mlp_class_name")
    if kind == "llama":
        cfg = lora.Config(**common, rotary_percentage=1.0, parallel_residual=False, bias=False,
                          **{NORM: "RMSNorm", MLP: "LLaMAMLP"}, intermediate_size=int(width * 172 // 64))
    else:
        cfg = lora.Config(**common, rotary_percentage=0.25, parallel_residual=True, bias=True,
                          **{NORM: "LayerNorm", MLP: "GptNeoxMLP"}, intermediate_size=4 * width)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = lora.GPT(cfg)
    torch.set_default_dtype(torch.float32)
    lora.mark_only_lora_as_trainable(model)
    return model


def run(lora, utils, version, kind, kv, parts, B, T, verbose=False):
    import torch
    model = build(lora, version, kind, kv, parts)
    excluded = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    live, peak, refs = [0], [0], {}
    class H:
        __slots__ = ("__weakref__", "t")
        def __init__(self, t): self.t = t
    def drop(key):
        refs[key] -= 1
        if refs[key] == 0: live[0] -= key[1]
    def pack(t):
        h = H(t); s = t.untyped_storage(); key = (s.data_ptr(), s.nbytes())
        if key[0] in excluded or key[1] == 0 or t.device.type == "meta": return h
        refs[key] = refs.get(key, 0) + 1
        if refs[key] == 1 and verbose:
            print("   ", tuple(t.shape), str(t.dtype)[6:], key[1], type(t.grad_fn).__name__ if t.grad_fn else "-")
        if refs[key] == 1:
            live[0] += key[1]; peak[0] = max(peak[0], live[0])
        weakref.finalize(h, drop, key)
        return h
    idx = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
        # finetune/lora.py: logits = model(input_ids, lm_head_chunk_size=128); logits[-1] = logits[-1][..., :-1, :];
        # loss = chunked_cross_entropy(logits, targets[..., 1:])
        logits = model(idx, lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        loss = utils.chunked_cross_entropy(logits, idx[..., 1:])
        loss.backward()
    return peak[0]


if __name__ == "__main__":
    source, version, kind, kv, parts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(",")
    lora, utils = import_litgpt(source, version)
    print(json.dumps({"version": version, "kind": kind, "kv": kv, "parts": parts,
                      "peaks": {f"{B}x{T}": run(lora, utils, version, kind, kv, parts, B, T, len(sys.argv) > 6)
                                for B, T in ((1, 64), (2, 32))}}))
