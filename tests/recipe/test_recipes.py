"""Recipes, optimizers, LoRA and quantization against the real frameworks (CPU, tiny models).

- Recipes: one real optimizer step per precision recipe x optimizer on a small torch model;
  parameter, gradient and optimizer-state bytes compared element for element (distinct
  storages, scalar `step`/`mu_product` counters excluded) with memfit.recipe.precision.
- 8-bit optimizers: bitsandbytes' own Adam8bit/AdamW8bit/Paged*/Lion8bit state tensors
  after a step on CPU (its 8-bit optimizers run there), quantization maps included.
- Adafactor: torch.optim.Adafactor's row/col/variance tensors.
- Quantization: transformers' from_pretrained(quantization_config=BitsAndBytesConfig(...))
  on CPU of a tiny Llama saved to a temp dir: every tensor a bitsandbytes layer holds.
- LoRA: peft.get_peft_model on tiny Llama (untied, Linear) and GPT-2 (tied, Conv1D):
  names, order, shapes, dtypes, trainable flags; QLoRA; one AdamW step on the adapters.
"""

from __future__ import annotations

import json
import math
import warnings

import needs
import pytest

# imported by the tests that use them: the accountings, the tables and the config checks below run without them
torch = needs.lazy("torch")
transformers = needs.lazy("transformers")
peft = needs.lazy("peft")
bnb = needs.lazy("bitsandbytes")

from memfit.recipe import lora  # noqa: E402

from memfit.recipe import optim

from memfit.recipe import precision

from memfit.recipe import quant

if needs.available("transformers"):
    transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

TORCH_DTYPE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16} if needs.available("torch") else {}
NAME_OF = {v: k for k, v in TORCH_DTYPE.items()} | ({torch.uint8: "uint8", torch.int8: "int8"} if TORCH_DTYPE else {})
SCALARS = {"step", "mu_product"}


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def distinct(tensors) -> int:
    """Bytes of distinct storages (a tensor referenced twice is counted once)."""
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device.type)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


# --- anchors: the published per-parameter accountings ------------------------------------
PSI = 7_500_000_000


def _state(recipe, **kw):
    r = precision.resolve(recipe, **kw)
    return precision.model_state_bytes(r, "adam", [(PSI,)])


def test_zero_paper_16_bytes_per_param():
    fp32_master = _state("16-true", master_weights="float32", dtypes={"optimizer_state": "float32"})
    assert fp32_master["total"] == 120 * 10**9 == 1.2e11
    assert (fp32_master["parameters"], fp32_master["gradients"], fp32_master["optimizer_state"]) == (2 * PSI, 2 * PSI, 12 * PSI)
    # the state follows the master copy without saying so
    assert _state("16-true", master_weights="float32")["total"] == 120 * 10**9


def test_deepspeed_grad_accum_and_megatron():
    accum = _state("16-true", master_weights="float32", grad_accum_dtype="float32", dtypes={"optimizer_state": "float32"})
    assert accum["total"] == 150 * 10**9 and accum["gradients"] == 6 * PSI
    megatron = _state("16-true", master_weights="float32", dtypes={"gradients": "float32", "optimizer_state": "float32"})
    assert megatron["total"] == 135 * 10**9 and megatron["gradients"] == 4 * PSI


def test_bytes_per_parameter_view():
    bpp = precision.bytes_per_parameter(precision.resolve("bf16-mixed"), "adamw")
    assert bpp == {"parameters": 4, "gradients": 4, "optimizer_state": 8}
    bpp = precision.bytes_per_parameter(precision.resolve("bf16-true"), "adamw8bit")
    assert bpp["optimizer_state"] == 2 + 2 * 4 / 256


def test_legacy_without_precision_keeps_todays_numbers():
    r = precision.resolve(None, dtypes={"parameters": "bfloat16"})
    items = precision.totals(precision.parameter_tensors(r, "adam", (10, 10)))
    assert items == {"parameters": 200, "gradients": 400, "activations": 0, "optimizer_state": 800}


def test_unknown_names_suggest():
    with pytest.raises(precision.RecipeError) as e:
        precision.resolve("bf16-mixd")
    assert e.value.suggestions[0] == "bf16-mixed" and e.value.field == "precision"
    with pytest.raises(quant.QuantError) as e:
        quant.method("nf5")
    assert "nf4" in e.value.suggestions
    with pytest.raises(ValueError, match="unknown optimizer"):
        optim.lookup("adamw9bit")


# --- recipes x torch.optim: one real step ---------------------------------------------------
TORCH_OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps),
    "adadelta": lambda ps: torch.optim.Adadelta(ps),
    "adam": lambda ps: torch.optim.Adam(ps),
    "adamw": lambda ps: torch.optim.AdamW(ps),
    "adamax": lambda ps: torch.optim.Adamax(ps),
    "nadam": lambda ps: torch.optim.NAdam(ps),
    "radam": lambda ps: torch.optim.RAdam(ps),
    "adafactor": lambda ps: torch.optim.Adafactor(ps),
    "lion": lambda ps: bnb.optim.Lion(ps),  # torch has no Lion; bitsandbytes' 32-bit one on fp32 params
}
RECIPE_NAMES = list(precision.RECIPES)


def Net():
    """The model of the one-step checks (a class made when a test needs it: torch is imported then)."""

    class Net(torch.nn.Module):
        """Linear + LayerNorm + Linear + a 3-dim parameter (Adafactor factors over the last two dims)."""

        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(12, 20)
            self.norm = torch.nn.LayerNorm(20)
            self.b = torch.nn.Linear(20, 6, bias=False)
            self.cube = torch.nn.Parameter(torch.randn(3, 4, 6) * 0.1)

        def forward(self, x):
            return (self.b(self.norm(self.a(x))).unsqueeze(0) * self.cube.sum(1, keepdim=True)).sum()

    return Net()


def _step(recipe: str, optimizer: str):
    torch.manual_seed(0)
    r = precision.RECIPES[recipe]
    model = Net()
    if r.autocast is None:
        model = model.to(TORCH_DTYPE[r.parameters])
    opt = TORCH_OPTIMIZERS[optimizer](model.parameters())
    x = torch.randn(5, 12, dtype=next(model.parameters()).dtype)
    if r.autocast is None:
        loss = model(x)
    else:
        with torch.autocast("cpu", dtype=TORCH_DTYPE[r.autocast]):
            loss = model(x)
    loss.float().backward()
    opt.step()
    return model, opt


def _measured(model, opt):
    params = list(model.parameters())
    state = [v for p in params for k, v in opt.state[p].items() if torch.is_tensor(v) and k not in SCALARS]
    return {"parameters": distinct(params), "gradients": distinct(p.grad for p in params), "optimizer_state": distinct(state)}


def _modelled(recipe, optimizer, model, **kw):
    r = precision.resolve(recipe, **kw)
    out = precision.model_state_bytes(r, optimizer, [tuple(p.shape) for p in model.parameters()])
    return {k: out[k] for k in ("parameters", "gradients", "optimizer_state")}


# memfit's lion is the reference Lion (state in the parameter's dtype); the only Lion installed,
# bitsandbytes' 32-bit one, always keeps fp32, so it is the reference on fp32 parameters only.
STEP_CASES = [(r, o) for o in TORCH_OPTIMIZERS for r in RECIPE_NAMES if o != "lion" or precision.RECIPES[r].parameters == "float32"]


@pytest.mark.parametrize("recipe,optimizer", STEP_CASES)
def test_recipe_one_step(recipe, optimizer):
    model, opt = _step(recipe, optimizer)
    assert _measured(model, opt) == _modelled(recipe, optimizer, model)


def test_state_dtype_is_the_parameters_dtype():
    model, opt = _step("bf16-true", "adamw")
    assert {v.dtype for s in opt.state.values() for k, v in s.items() if k != "step"} == {torch.bfloat16}
    items = precision.parameter_tensors(precision.resolve("bf16-true"), "adamw", (20, 12))
    assert [(i.label, i.dtype) for i in items if i.category == "optimizer_state"] == [("exp_avg", "bfloat16"), ("exp_avg_sq", "bfloat16")]


def test_master_weights_and_grad_accum_against_a_manual_mixed_precision_step():
    """DeepSpeed/Apex-O2 style by hand: fp16 model, fp32 master copies with fp32 grads, AdamW on the masters."""
    torch.manual_seed(0)
    model = Net().half()
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    opt = torch.optim.AdamW(masters)
    model(torch.randn(5, 12, dtype=torch.float16)).float().backward()
    for m, p in zip(masters, model.parameters()):
        m.grad = p.grad.float()
    opt.step()
    params = list(model.parameters())
    state = [v for m in masters for k, v in opt.state[m].items() if k != "step"]
    measured = {
        "parameters": distinct(params),
        "gradients": distinct(p.grad for p in params) + distinct(m.grad for m in masters),
        "optimizer_state": distinct(masters) + distinct(state),
    }
    assert measured == _modelled("16-true", "adamw", model, master_weights="float32", grad_accum_dtype="float32")


# --- bitsandbytes 8-bit optimizers, on CPU ----------------------------------------------------
BNB = {
    "adam8bit": "Adam8bit",
    "adamw8bit": "AdamW8bit",
    "paged_adam8bit": "PagedAdam8bit",
    "paged_adamw8bit": "PagedAdamW8bit",
    "lion8bit": "Lion8bit",
}


def Wide():
    """The model of the 8-bit state checks (made when a test needs it: torch is imported then)."""

    class Wide(torch.nn.Module):
        """Tensors on both sides of min_8bit_size (4096) and of a 256-block boundary."""

        def __init__(self):
            super().__init__()
            self.big = torch.nn.Linear(70, 100)  # 7000 elements: 8-bit, 28 blocks (last one partial)
            self.exact = torch.nn.Linear(64, 64, bias=False)  # 4096: exactly min_8bit_size -> 8-bit
            self.small = torch.nn.Linear(100, 40)  # 4000 < 4096: fp32 state

        def forward(self, x):
            return self.small(self.exact(self.big(x)[:, :64]).repeat(1, 2)[:, :100]).sum()

    return Wide()


@pytest.mark.parametrize("name", list(BNB))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bnb_8bit_state(name, dtype):
    torch.manual_seed(0)
    model = Wide().to(TORCH_DTYPE[dtype])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = getattr(bnb.optim, BNB[name])(model.parameters())
        model(torch.randn(3, 70, dtype=TORCH_DTYPE[dtype])).float().backward()
        opt.step()
    layout = {}
    for pname, p in model.named_parameters():
        layout[pname] = sorted((k, tuple(v.shape), NAME_OF[v.dtype]) for k, v in opt.state[p].items() if torch.is_tensor(v) and not k.startswith("qmap"))
        modelled = optim.state_tensors(name, tuple(p.shape), dtype)
        assert layout[pname] == sorted(modelled), pname
    states = [v for p in model.parameters() for v in opt.state[p].values() if torch.is_tensor(v)]
    r = precision.resolve("bf16-true" if dtype == "bfloat16" else "32-true")
    modelled = precision.model_state_bytes(r, name, [tuple(p.shape) for p in model.parameters()])
    assert distinct(states) == modelled["optimizer_state"]  # the shared qmaps once
    assert layout["big.weight"][0] == ("absmax1", (28,), "float32")


def test_bnb_constants_read_from_its_source():
    import inspect

    needs.module("bitsandbytes")
    from bitsandbytes.optim import optimizer as bnb_optimizer

    source = inspect.getsource(bnb_optimizer.Optimizer2State.init_state)
    assert f"blocksize = {optim.BNB_BLOCKSIZE}" in source
    assert inspect.signature(bnb_optimizer.Optimizer2State.__init__).parameters["min_8bit_size"].default == optim.BNB_MIN_8BIT_SIZE
    assert bnb.functional.create_dynamic_map().numel() == optim.BNB_QMAP_ELEMENTS


def test_adafactor_factored_shapes():
    p = torch.nn.Parameter(torch.randn(3, 4, 6))
    opt = torch.optim.Adafactor([p])
    p.grad = torch.ones_like(p)
    opt.step()
    got = sorted((k, tuple(v.shape)) for k, v in opt.state[p].items() if k != "step")
    assert got == sorted((k, s) for k, s, _ in optim.state_tensors("adafactor", (3, 4, 6), "float32"))
    assert optim.state_tensors("adafactor", (7,), "bfloat16") == [("variance", (7,), "bfloat16")]


# --- quantization: transformers + bitsandbytes on CPU -----------------------------------------
LLAMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=130, max_position_embeddings=64)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(path)
    return path


def _linears(model):
    from transformers.pytorch_utils import Conv1D

    rows = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            rows.append((name, m.in_features, m.out_features, m.bias is not None))
        elif isinstance(m, Conv1D):
            rows.append((name, m.weight.shape[0], m.weight.shape[1], True))
    return rows


def _bnb_config(method, double_quant, skip):
    if method == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=method, bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=skip
    )


def _load(llama_dir, method, double_quant=False, skip=None):
    cfg = _bnb_config(method, double_quant, skip)
    return transformers.AutoModelForCausalLM.from_pretrained(llama_dir, quantization_config=cfg, device_map="cpu", dtype=torch.bfloat16)


def _held(module):
    """Every tensor a bitsandbytes layer's weight holds, by bitsandbytes' own names."""
    w = module.weight
    if isinstance(module, bnb.nn.Linear8bitLt):
        # the first forward moves CB/SCB from the weight to the layer's MatmulLtState
        return {"weight": w.data, "weight.SCB": w.SCB if w.SCB is not None else module.state.SCB}
    qs = w.quant_state
    held = {"weight": w.data, "quant_state.absmax": qs.absmax, "quant_state.code": qs.code}
    if qs.nested:
        held |= {"quant_state.offset": qs.offset, "quant_state.state2.absmax": qs.state2.absmax, "quant_state.state2.code": qs.state2.code}
    return held


QUANT_CASES = [("nf4", False, None), ("nf4", True, None), ("fp4", False, None), ("fp4", True, ["lm_head", "down_proj"]), ("int8", False, None), ("int8", False, ["o_proj"])]


@pytest.mark.parametrize("method,double_quant,skip", QUANT_CASES)
def test_quantized_storage(llama_dir, method, double_quant, skip):
    full = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    linears = _linears(full)
    model = _load(llama_dir, method, double_quant, skip)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))}
    assert list(layers) == quant.quantized_modules(linears, skip_modules=skip)
    for (name, fan_in, fan_out, _) in linears:
        if name not in layers:
            continue
        held = _held(layers[name])
        modelled = quant.weight_tensors(fan_in, fan_out, method, double_quant=double_quant)
        assert sorted((k, tuple(v.shape), NAME_OF[v.dtype]) for k, v in held.items()) == sorted(modelled), name
        assert distinct(held.values()) == quant.weight_bytes(fan_in, fan_out, method, double_quant=double_quant)
    # everything in the model: bitsandbytes' tensors plus the bf16 rest
    everything = [t for m in layers.values() for t in _held(m).values()]
    everything += [p for n, p in model.named_parameters() if n.rsplit(".", 1)[0] not in layers]
    rest = sum(math.prod(p.shape) * 2 for n, p in model.named_parameters() if n.rsplit(".", 1)[0] not in layers)
    assert distinct(everything) == rest + sum(quant.weight_bytes(i, o, method, double_quant=double_quant) for n, i, o, _ in linears if n in layers)


ROBERTA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, vocab_size=130,
               max_position_embeddings=66, tie_word_embeddings=False)


@pytest.mark.parametrize("family,skip", [("llama", None), ("llama", []), ("llama", ["q_proj"]), ("llama", ["lm_head"]),
                                         ("roberta", None), ("roberta", []), ("roberta", ["decoder"])])
def test_head_quantized_is_the_output_layer_bitsandbytes_converts(llama_dir, tmp_path, family, skip):
    """adapters.head_quantized (what chunked_loss prices a dequantized head by) is whether transformers' loader made the
    family's output layer a bitsandbytes Linear4bit: llm_int8_skip_modules (memfit's quantization.skip_modules) and its
    defaults, by the family's own output-layer name (RoBERTa's untied lm_head.decoder: no literal lm_head)."""
    from memfit.models import hf_config
    from memfit.models.hf_layers import head
    from memfit.models.hf_params import linear_modules, parameters
    from memfit.recipe import adapters

    path = llama_dir
    if family == "roberta":
        path = tmp_path / "roberta"
        transformers.RobertaForMaskedLM(transformers.RobertaConfig(**ROBERTA)).save_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=_bnb_config("nf4", False, skip), device_map="cpu",
                                                              dtype=torch.bfloat16) if family == "llama" else \
        transformers.AutoModelForMaskedLM.from_pretrained(path, quantization_config=_bnb_config("nf4", False, skip), device_map="cpu", dtype=torch.bfloat16)
    cfg = hf_config.normalize(json.loads((path / "config.json").read_text()))
    layer = adapters.output_layer(cfg, head(cfg))
    real = isinstance(model.get_submodule(layer), bnb.nn.Linear4bit)
    data = {"lora": {"r": 8, "target_modules": "all-linear"}, "quantization": {"method": "nf4", **({} if skip is None else {"skip_modules": skip})}}
    assert adapters.head_quantized(cfg, data, parameters(cfg), linear_modules(cfg), head(cfg)) is real
    assert real is (skip is not None and layer.rpartition(".")[2] not in skip)  # the cases do reach both answers


def test_quantize_4bit_function_matches_odd_sizes():
    for n_out, n_in in [(3, 5), (7, 37), (130, 64)]:  # odd element counts, partial blocks, > 256 blocks
        for dq in (False, True):
            out, qs = bnb.functional.quantize_4bit(torch.randn(n_out, n_in, dtype=torch.bfloat16), quant_type="nf4", compress_statistics=dq)
            held = {"weight": out, "quant_state.absmax": qs.absmax, "quant_state.code": qs.code}
            if dq:
                held |= {"quant_state.offset": qs.offset, "quant_state.state2.absmax": qs.state2.absmax, "quant_state.state2.code": qs.state2.code}
            assert sorted((k, tuple(v.shape), NAME_OF[v.dtype]) for k, v in held.items()) == sorted(quant.weight_tensors(n_in, n_out, "nf4", double_quant=dq))
    big = quant.weight_tensors(4096, 4096, "nf4", double_quant=True)
    assert dict((k, s) for k, s, _ in big)["quant_state.state2.absmax"] == (1024,)


def test_int8_params_direct():
    layer = bnb.nn.Linear8bitLt(33, 17, has_fp16_weights=False).to("cpu")
    held = {"weight": layer.weight.data, "weight.SCB": layer.weight.SCB}
    assert sorted((k, tuple(v.shape), NAME_OF[v.dtype]) for k, v in held.items()) == sorted(quant.weight_tensors(33, 17, "int8"))


# --- LoRA: peft.get_peft_model ---------------------------------------------------------------
GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=130, n_positions=64)


def _peft(model, **cfg):
    return peft.get_peft_model(model, peft.LoraConfig(**cfg))


def _rows(model):
    return [(n, tuple(p.shape), NAME_OF.get(p.dtype, str(p.dtype)), p.requires_grad) for n, p in model.named_parameters()]


def _mine(params, linears, cfg, base="bfloat16", **kw):
    return [(p.name, p.shape, p.dtype or base, p.trainable) for p in lora.peft_parameters(params, linears, cfg, **kw)]


LORA_CASES = {
    "attention": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "all-linear": dict(r=8, target_modules="all-linear"),
    "regex": dict(r=2, target_modules=r".*layers\.1\.mlp\.(up|down)_proj"),
    "save-head": dict(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head", "embed_tokens"]),
    "default-targets": dict(r=4),
}


@pytest.mark.parametrize("case", list(LORA_CASES))
def test_lora_llama_names_shapes_dtypes(case):
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).to(torch.bfloat16)
    params = [(n, tuple(p.shape)) for n, p in base.named_parameters()]
    linears = _linears(base)
    cfg = dict(LORA_CASES[case])
    mine_cfg = {"r": cfg["r"], "alpha": cfg.get("lora_alpha", 8)}
    for key in ("target_modules", "modules_to_save"):
        if key in cfg:
            mine_cfg[key] = cfg[key]
    model = _peft(base, **cfg)
    assert _rows(model) == _mine(params, linears, mine_cfg, model_type="llama")


def test_lora_gpt2_conv1d_tied():
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).to(torch.float16)
    params = [(n, tuple(p.shape)) for n, p in base.named_parameters()]
    linears = _linears(base)
    for cfg in (dict(r=4, target_modules="all-linear"), dict(r=4, target_modules=["c_attn", "c_fc"])):
        model = _peft(transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).to(torch.float16), fan_in_fan_out=True, **cfg)
        assert _rows(model) == _mine(params, linears, cfg, base="float16")
    assert lora.DEFAULT_TARGETS["gpt2"] == ["c_attn"]


def test_default_targets_are_peft_s():
    needs.module("peft")
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT

    assert all(PEFT[k] == v for k, v in lora.DEFAULT_TARGETS.items())


def test_lora_errors():
    linears = [("model.layers.0.self_attn.q_proj", 64, 64, False), ("model.layers.0.mlp.up_proj", 64, 96, False), ("lm_head", 64, 130, False)]
    with pytest.raises(lora.LoraError) as e:
        lora.targeted(linears, lora.spec({"r": 4, "target_modules": ["qproj"]}))
    assert "q_proj" in str(e.value) and "up_proj" in str(e.value) and e.value.suggestions[0] == "q_proj"
    for r in (0, -1, 1.5, True):
        with pytest.raises(lora.LoraError, match="positive"):
            lora.spec({"r": r, "target_modules": ["q_proj"]})
    # peft's own refusals: r <= 0 when it builds the layers, a target that matches nothing
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    with pytest.raises(ValueError, match="positive"):
        _peft(base, r=0, target_modules=["q_proj"])
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    with pytest.raises(ValueError, match="not found"):
        _peft(base, r=4, target_modules=["qproj"])


@pytest.mark.parametrize("method", ["nf4", "int8"])
def test_qlora_adapters_fp32_and_step(llama_dir, method):
    model = _load(llama_dir, method, double_quant=True)
    linears = _linears(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)))
    params = [(n, tuple(p.shape)) for n, p in transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).named_parameters()]
    cfg = {"r": 4, "target_modules": "all-linear"}
    model = _peft(model, **cfg)
    mine = {p.name: p for p in lora.peft_parameters(params, linears, cfg)}
    got = dict(model.named_parameters())
    assert list(got) == list(mine)
    for name, p in got.items():
        if mine[name].role == "adapter":
            assert (tuple(p.shape), p.dtype, p.requires_grad) == (mine[name].shape, torch.float32, True)
        else:
            assert not p.requires_grad
    # one AdamW step on the adapters: fp32 grads and fp32 state, as precision models a fp32 param in bf16-true
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(input_ids=torch.randint(0, 130, (2, 8)), labels=torch.randint(0, 130, (2, 8))).loss.backward()
    opt.step()
    trainable = [p for p in model.parameters() if p.requires_grad]
    r = precision.resolve("bf16-true")
    modelled = precision.totals(i for p in trainable for i in precision.parameter_tensors(r, "adamw", tuple(p.shape), param_dtype="float32"))
    measured_state = distinct(v for p in trainable for k, v in opt.state[p].items() if k != "step")
    assert (distinct(p.grad for p in trainable), measured_state) == (modelled["gradients"], modelled["optimizer_state"])
    assert modelled["parameters"] == 4 * lora.adapter_count(linears, cfg)


def test_optimizer_table_keeps_the_seed_counts():
    from memfit.recipe.calculator import OPTIMIZER_STATES

    assert optim.STATE_COUNTS == OPTIMIZER_STATES


def test_docs_table_is_generated():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    assert precision.table() in doc


# --- every transformer family memfit models (models/hf.py), on the meta device ---------------
def _families():
    from transformers_configs import CONFIGS, OTHER_ARCHITECTURES

    from memfit.models import hf, hf_config

    for model_type, givens in CONFIGS.items():
        for i, given in enumerate(givens):
            cfg = hf_config.normalize({"model_type": model_type, **given})
            for arch in [hf.architecture(cfg)] + ([OTHER_ARCHITECTURES[model_type]] if model_type in OTHER_ARCHITECTURES else []):
                yield pytest.param(model_type, given, arch, id=f"{model_type}{i}-{arch}")


@pytest.mark.parametrize("model_type,given,arch", list(_families()))
def test_families_lora_and_quantized_modules(model_type, given, arch):
    needs.module("transformers")
    from transformers_configs import build
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    from memfit.models import adapter_tables, hf, hf_config

    cfg = dict(hf_config.normalize({"model_type": model_type, **given}), architectures=[arch])
    params, linears = hf.parameters(cfg), hf.linear_modules(cfg)
    head = lora.OUTPUT_HEADS[hf.head(cfg)]
    model = build(transformers, model_type, given, arch)
    # quantization: transformers' default skips and the class's _keep_in_fp32_modules (Bnb4BitHfQuantizer passes them
    # to get_modules_to_not_convert), over memfit's linear modules
    tied = [k for pair in model.all_tied_weights_keys.items() for k in pair]
    skipped = get_keys_to_not_convert(model) + sorted(model._keep_in_fp32_modules or ())
    theirs = [n for n, *_ in linears if should_convert_module(n, skipped)]
    assert quant.quantized_modules(linears, output_head=head, params=params, tied=tied,
                                   keep_in_fp32=adapter_tables.KEEP_IN_FP32.get(model_type, ())) == theirs
    # LoRA: the whole named_parameters() list
    # (the attention's projections by name where peft retargets the experts or cannot wrap the router; DeepSeek-V3's
    # latent attention names its own, q_proj only when q_lora_rank is null)
    named = {"deepseek_v3": ["q_a_proj", "q_proj", "kv_b_proj", "o_proj"]}.get(model_type, ["q_proj", "v_proj"])
    cases = [{"r": 4, "target_modules": named}] if model_type in lora.MOE_RETARGETED or model_type in lora.PEFT_FAILS else [{"r": 4, "target_modules": "all-linear"}]
    cases.append({"r": 3})  # peft's per-family default targets
    for cfg_lora in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if "target_modules" not in cfg_lora and (model_type not in lora.DEFAULT_TARGETS or model_type in lora.MOE_RETARGETED):
                with pytest.raises(ValueError, match="target_modules"):
                    peft.get_peft_model(build(transformers, model_type, given, arch), peft.LoraConfig(**cfg_lora))
                with pytest.raises(lora.LoraError, match="target_modules is not given"):
                    lora.spec(cfg_lora, model_type=model_type)
                continue
            got = peft.get_peft_model(build(transformers, model_type, given, arch), peft.LoraConfig(**cfg_lora))
        mine = lora.peft_parameters(params, linears, cfg_lora, output_head=head, model_type=model_type)
        assert [(n, tuple(p.shape), p.requires_grad) for n, p in got.named_parameters()] == [(p.name, p.shape, p.trainable) for p in mine]


def test_mixtral_all_linear_is_resolved_and_a_regex_refused_not_guessed():
    # all-linear is resolved as peft resolves it (tests/recipe/test_lora_moe_all_linear.py measures it); a regex goes
    # through peft's remap with rank patterns memfit does not model
    assert lora.spec({"r": 4, "target_modules": "all-linear"}, model_type="mixtral").target_modules == lora.ALL_LINEAR
    with pytest.raises(lora.LoraError, match="MoE"):
        lora.spec({"r": 4, "target_modules": ".*proj"}, model_type="mixtral")


@pytest.mark.parametrize("method,double_quant", [("nf4", True), ("fp4", False), ("int8", False)])
def test_qlora_whole_model_bytes(llama_dir, method, double_quant):
    """QLoRA end to end: every byte of the quantized, peft-wrapped model (distinct storages of its
    parameters and QuantState tensors) against training_parameters."""
    from memfit.models import hf, hf_config

    cfg = hf_config.normalize({"model_type": "llama", **LLAMA})
    params, linears = hf.parameters(cfg), hf.linear_modules(cfg)
    lora_cfg = {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"], "modules_to_save": ["embed_tokens"]}
    qcfg = {"method": method, "double_quant": double_quant}
    model = _peft(_load(llama_dir, method, double_quant), r=4, target_modules=lora_cfg["target_modules"], modules_to_save=lora_cfg["modules_to_save"])
    rows = lora.training_parameters(params, linears, base_dtype="bfloat16", lora_config=lora_cfg, quantization=qcfg)
    held = list(model.parameters())
    for m in model.modules():
        if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            held += list(_held(m).values())
    width = {"bfloat16": 2, "float32": 4, "uint8": 1, "int8": 1}
    assert distinct(held) == sum(math.prod(r.shape) * width[r.dtype] for r in rows)
    got = [(n, p.requires_grad) for n, p in model.named_parameters()]
    assert got == [(r.name, r.trainable) for r in rows if r.role != "quant_state"]


def test_per_parameter_view():
    r = precision.resolve("16-true", master_weights="float32", grad_accum_dtype="float32")
    shapes = [(64, 32), (32,)]
    entries = [(precision.parameter_tensors(r, "adamw", s), 3, math.prod(s), True) for s in shapes]
    rows, every, trainable = precision.per_parameter_view(entries)
    assert every == trainable == 3 * (64 * 32 + 32)
    assert sum(row.per_parameter for row in rows) == 20
    assert {(row.label, row.per_parameter, row.origin) for row in rows if row.category == "gradients"} == {
        ("grad", 2, "like its parameter"),
        ("grad accum buffer", 4, "grad_accum_dtype"),
    }
    lines = precision.view_lines(rows, every, trainable)
    assert lines[-1].split()[:2] == ["total", "20"] and all(len(line) <= 80 for line in lines)


# --- through the pipeline: configs with the recipe keys ----------------------------------------
from memfit.check.pipeline import check  # noqa: E402

ZERO = "memfit: 1\ndevice: {memory: 200 GB}\nprecision: 16-true\nmaster_weights: float32\noptimizer: adam\nparameters:\n  - {name: w, shape: [7500000000]}\n"


@pytest.mark.parametrize(
    "extra,total",
    [
        ("", 120 * 10**9),
        ("dtypes: {optimizer_state: float32}\n", 120 * 10**9),
        ("training: {grad_accum_dtype: float32}\n", 150 * 10**9),
        ("dtypes: {gradients: float32}\n", 135 * 10**9),
    ],
)
def test_published_recipes_through_check(extra, total):
    result = check(ZERO + extra)
    assert not result.diagnostics and result.footprint["total"] == total


def test_bnb_config_through_check_matches_a_real_step():
    """The Wide model declared as a config: check's optimizer_state equals bitsandbytes' own
    state after a step, quantization maps included."""
    torch.manual_seed(0)
    model = Wide().to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = bnb.optim.AdamW8bit(model.parameters())
        model(torch.randn(3, 70, dtype=torch.bfloat16)).float().backward()
        opt.step()
    shapes = "\n".join(f"  - {list(p.shape)}" for p in model.parameters())
    result = check(f"memfit: 1\ndevice: {{memory: 1 GiB}}\nprecision: bf16-true\noptimizer: adamw8bit\nparameters:\n{shapes}\n")
    assert not result.diagnostics
    states = [v for p in model.parameters() for v in opt.state[p].values() if torch.is_tensor(v)]
    params = list(model.parameters())
    assert result.footprint["optimizer_state"] == distinct(states)
    assert (result.footprint["parameters"], result.footprint["gradients"]) == (distinct(params), distinct(p.grad for p in params))


def test_adafactor_through_check_uses_the_shape():
    p = torch.nn.Parameter(torch.randn(64, 48, dtype=torch.bfloat16))
    opt = torch.optim.Adafactor([p])
    p.grad = torch.ones_like(p)
    opt.step()
    result = check("memfit: 1\ndevice: {memory: 1 GiB}\nprecision: bf16-true\noptimizer: adafactor\nparameters:\n  - [64, 48]\n")
    assert result.footprint["optimizer_state"] == distinct(v for k, v in opt.state[p].items() if k != "step") == (64 + 48) * 2


BAD = {
    "precision: bf16-mixd\noptimizer: adam\n": [(3, 12, "unknown-precision", "did you mean 'bf16-mixed'")],
    "optimizer: adamw8bt\n": [(3, 12, "unknown-optimizer", "did you mean 'adamw8bit'")],
    "precision: 32-true\nmaster_weights: float32\noptimizer: adam\n": [(4, 17, "master-weights-noop", "changes nothing")],
    "optimizer: adam\nlora: {r: 0, target_modules: [q_proj]}\n": [(4, 1, "needs-transformer", "transformer"), (4, 11, "bad-lora", "positive")],
    "optimizer: adam\nquantization: {method: nf5}\n": [(4, 1, "needs-transformer", "transformer"), (4, 24, "unknown-quantization", "did you mean 'nf4'")],
}


@pytest.mark.parametrize("body", list(BAD))
def test_bad_recipe_input_is_positioned(body):
    result = check("memfit: 1\ndevice: {memory: 1 GiB}\n" + body + "parameters: [[10, 10]]\n")
    got = [(d.range.start_line + 1, d.range.start_character + 1, d.code, d.message) for d in result.diagnostics]
    assert [(line, col, code) for line, col, code, _ in got] == [(line, col, code) for line, col, code, _ in BAD[body]]
    assert all(want in message for (*_, message), (*_, want) in zip(got, BAD[body]))


def test_a_4bit_method_is_one_decision_whatever_its_spelling(tmp_path):
    """quantization.method as quant.method() reads it ('NF4' is nf4) makes the base 4-bit everywhere at once: its
    storage (uint8 weights), the adapters' dtype and the activations a 4-bit base keeps. (Before one decision,
    'NF4' stored the weights 4-bit but priced a dense base's activations under bf16-mixed: 2.3x the total.)"""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}))
    body = ("memfit: 1\ndevice: {memory: 80 GiB}\nprecision: bf16-mixed\noptimizer: adamw\n"
            f"model: {{hf_config: {tmp_path / 'config.json'}}}\n"
            "training: {micro_batch: 1, seq_len: 128}\nlora: {r: 8, target_modules: [q_proj]}\nquantization: {method: %s}\n")
    plain, spelled = check(body % "nf4"), check(body % "NF4")
    assert not plain.diagnostics and not spelled.diagnostics
    assert spelled.footprint == plain.footprint
    assert quant.bnb_4bit({"method": "NF4"}) and quant.bnb_4bit({"method": "fp4"})
    assert not any(quant.bnb_4bit(s) for s in ({"method": "int8"}, {"method": "nf4-torchao"}, {"method": "nf5"}, None))


def test_master_weights_noop_keeps_the_footprint_and_counts_no_copy():
    result = check("memfit: 1\ndevice: {memory: 1 GiB}\nprecision: bf16-mixed\nmaster_weights: float32\noptimizer: adam\nparameters: [[10, 10]]\n")
    assert [d.severity for d in result.diagnostics] == ["warning"]
    assert result.footprint["optimizer_state"] == 800


def test_configs_without_recipe_keys_keep_the_seed_recipe():
    from memfit.recipe.costs import Recipe

    result = check("memfit: 1\ndevice: {memory: 1 GiB}\ndtypes: {parameters: bfloat16}\noptimizer: adam\nparameters: [[10, 10]]\n")
    assert type(result.config.recipe) is Recipe
    assert result.footprint == {"parameters": 200, "gradients": 400, "activations": 0, "optimizer_state": 800, "total": 1400}


def test_explain_shows_bytes_per_parameter():
    from memfit.report.explain import render

    text = render(check(ZERO + "training: {grad_accum_dtype: float32}\n"))
    assert "bytes per parameter" in text
    rows = {line.split()[0] + " " + line.split()[-1]: line.split()[1] for line in text.splitlines() if line.startswith("  ") and "(" in line and line.split()[0] in ("parameters", "gradients", "optimizer_state")}
    assert any(line.split()[:2] == ["total", "20"] for line in text.splitlines())
    assert "master weight (master_weights)" in text and "grad accum buffer (grad_accum_dtype)" in text
    assert rows


@pytest.mark.parametrize("method", ["nf4", "int8"])
def test_transformer_parameters_against_a_real_qlora_step(llama_dir, method):
    """adapters.transformer_parameters (what the transformer model form costs under lora +
    quantization) against a quantized, peft-wrapped Llama after one AdamW step: parameters
    (with every QuantState tensor), gradients and optimizer state, byte for byte."""
    from memfit.recipe import adapters
    from memfit.config.build import build, make_tensor
    from memfit.recipe.costs import width
    from memfit.models import hf, hf_config
    from memfit.placement.place import place

    lora_cfg = {"r": 4, "target_modules": "all-linear", "modules_to_save": ["embed_tokens"]}
    data = {"memfit": 1, "precision": "bf16-true", "optimizer": "adamw", "lora": lora_cfg, "quantization": {"method": method, "double_quant": True}}
    config, _ = build(data)
    cfg = hf_config.normalize({"model_type": "llama", **LLAMA})
    rows, problems = adapters.transformer_rows(cfg, data, "bfloat16", hf.parameters(cfg), hf.linear_modules(cfg), hf.head(cfg))
    assert not problems
    tensors = [make_tensor("parameters", ("model",), r.name, list(r.shape), 1, r.trainable, None if r.dtype == "bfloat16" else width(r.dtype), config) for r in rows]
    modelled = place(tensors).footprint

    model = _peft(_load(llama_dir, method, double_quant=True), r=4, target_modules="all-linear", modules_to_save=["embed_tokens"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable)
    model(input_ids=torch.randint(0, 130, (2, 8)), labels=torch.randint(0, 130, (2, 8))).loss.backward()
    opt.step()
    held = list(model.parameters())
    for m in model.modules():
        if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            held += list(_held(m).values())
    assert modelled["parameters"] == distinct(held)
    assert modelled["gradients"] == distinct(p.grad for p in trainable)
    assert modelled["optimizer_state"] == distinct(v for p in trainable for k, v in opt.state[p].items() if k != "step")


def test_transformer_parameters_unmatched_targets_listed():
    from memfit.recipe import adapters
    from memfit.diagnostics import codes
    from memfit.models import hf, hf_config

    data = {"memfit": 1, "optimizer": "adamw", "lora": {"r": 4, "target_modules": ["qproj"]}}
    cfg = hf_config.normalize({"model_type": "llama", **LLAMA})
    _, problems = adapters.transformer_rows(cfg, data, "bfloat16", hf.parameters(cfg), hf.linear_modules(cfg), hf.head(cfg))
    assert [(p.path, p.code) for p in problems] == [(("lora", "target_modules"), codes.LORA_NO_MATCH)]
    assert "q_proj" in problems[0].message and "down_proj" in problems[0].message


@pytest.mark.parametrize("name,per_param", [("llama-3.2-1b-deepspeed.yaml", 20), ("llama-3.2-1b-bf16-mixed.yaml", 16)])
def test_recipe_examples(name, per_param):
    from pathlib import Path

    result = check((Path(__file__).resolve().parents[2] / "examples" / name).read_text())
    assert not result.diagnostics
    assert result.footprint["total"] == per_param * 1_235_814_400  # Llama-3.2-1B's parameter count


def test_qlora_config_through_check_matches_a_real_step(llama_dir):
    """The whole pipeline: a config with model.transformer + lora + quantization gives, for
    parameters, gradients and optimizer state, what a quantized peft Llama holds after one
    AdamW step on CPU."""
    import json as _json

    transformer = _json.dumps({"model_type": "llama", **LLAMA})
    text = (
        "memfit: 1\ndevice: {memory: 1 GiB}\nprecision: bf16-true\noptimizer: adamw\n"
        f"model: {{transformer: {transformer}}}\ntraining: {{micro_batch: 2, seq_len: 8}}\n"
        "lora: {r: 4, target_modules: [q_proj, v_proj, down_proj], modules_to_save: [embed_tokens]}\n"
        "quantization: {method: nf4, double_quant: true, compute_dtype: bfloat16}\n"
    )
    result = check(text)
    assert not result.diagnostics, result.diagnostics
    model = _peft(_load(llama_dir, "nf4", double_quant=True), r=4, target_modules=["q_proj", "v_proj", "down_proj"], modules_to_save=["embed_tokens"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable)
    model(input_ids=torch.randint(0, 130, (2, 8)), labels=torch.randint(0, 130, (2, 8))).loss.backward()
    opt.step()
    held = list(model.parameters()) + list(model.buffers())  # (the rotary inv_freq pair: on the device, under parameters)
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            held += list(_held(m).values())
    fp = result.footprint
    assert fp["parameters"] == distinct(held)
    assert fp["gradients"] == distinct(p.grad for p in trainable)
    assert fp["optimizer_state"] == distinct(v for p in trainable for k, v in opt.state[p].items() if k != "step")
    names = [t.name for t in result.config.tensors if t.category == "parameters" and not t.buffer]
    assert [n for n, _ in model.named_parameters()] == [n for n in names if ".quant_state." not in n and not n.endswith(".weight.SCB")]


def test_lora_on_a_transformer_with_unmatched_targets_is_positioned():
    import json as _json

    transformer = _json.dumps({"model_type": "llama", **LLAMA})
    text = f"memfit: 1\ndevice: {{memory: 1 GiB}}\noptimizer: adamw\nmodel: {{transformer: {transformer}}}\ntraining: {{micro_batch: 1, seq_len: 8}}\nlora:\n  r: 4\n  target_modules: [qproj]\n"
    result = check(text)
    assert [(d.range.start_line + 1, d.code) for d in result.diagnostics] == [(8, "lora-no-match")]
    assert "q_proj" in result.diagnostics[0].message and "did you mean 'q_proj'" in result.diagnostics[0].message


def test_qlora_example_by_hand():
    """examples/llama7b-qlora.yaml against arithmetic written out from bitsandbytes' layout
    (nf4 + double quant per weight: n/2 packed, n/64 uint8 absmax, 16 fp32 code, fp32 offset,
    ceil(n/64/256) fp32 second-level scales, 256 fp32 code copy)."""
    from pathlib import Path

    from memfit.report.explain import render

    def nf4_dq(n):
        return n // 2 + n // 64 + 16 * 4 + 4 + -(-(n // 64) // 256) * 4 + 256 * 4

    attn, mlp = 4096 * 4096, 4096 * 11008
    quantized = 128 * nf4_dq(attn) + 96 * nf4_dq(mlp)
    bf16 = 2 * (2 * 32000 * 4096 + 65 * 4096)  # embeddings, head, 65 RMSNorm weights
    adapters = 128 * 16 * (4096 + 4096)  # r 16 on q, k, v, o of 32 layers, fp32
    buffers = 2 * 4 * (128 // 2)  # the rotary embedding's inv_freq and original_inv_freq: head_dim / 2 each, fp32 (as loaded)
    path = Path(__file__).resolve().parents[2] / "examples" / "llama7b-qlora.yaml"
    result = check(path.read_text(), str(path))
    assert not result.diagnostics
    fp = result.footprint
    assert fp["parameters"] == quantized + bf16 + 4 * adapters + buffers == 3_932_945_792
    assert (fp["gradients"], fp["optimizer_state"]) == (4 * adapters, 8 * adapters)
    text = render(result)
    assert "4-bit weight, packed (quantization)" in text and "LoRA adapter (peft)" in text
