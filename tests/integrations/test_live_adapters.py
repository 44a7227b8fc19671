"""A live peft model's adapters as it keeps them (issue 32): use_dora and the adapters' dtype go into memfit's `lora`
section, so the callback's figures are those of the adapters the run trains."""

from __future__ import annotations

import needs
import pytest

torch = needs.module("torch")
needs.module("transformers")
needs.module("peft")

import hf_measure  # noqa: E402

from memfit.integrations.live import lora_section  # noqa: E402


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("autocast, dora, dtype", [(True, False, None), (False, True, "bfloat16")])
def test_the_live_adapters_dtype_and_dora(autocast, dora, dtype):
    lora = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "use_dora": dora, "autocast_adapter_dtype": autocast}
    model = hf_measure.build(hf_measure.tiny("llama"), "sdpa", "bf16-true", lora)
    section, notes = lora_section(model)
    assert section.get("dtype") == dtype
    assert section.get("use_dora", False) is dora
    assert not [n for n in notes if "use_dora" in n]  # modelled, no longer a note
