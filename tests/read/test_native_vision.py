"""A vision-language fine-tune's image settings in the native formats (issue 34, read/native/vision.py): LLaMA-Factory's
image_max_pixels / image_min_pixels / freeze_vision_tower and Axolotl's image_size become memfit's training keys for
Qwen2-VL / Qwen2.5-VL, through `memfit convert` and `memfit check`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "qwen2.5-vl-7b-instruct.json"


def memfit(*args, cwd):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def setup(tmp_path: Path, name: str, text: str) -> Path:
    shutil.copy(MODEL, tmp_path / "qwen.json")
    (tmp_path / "memfit.toml").write_text('[models]\n"Qwen/Qwen2.5-VL-7B-Instruct" = "qwen.json"\n')
    (tmp_path / name).write_text(text)
    return tmp_path / name


def converted(path: Path) -> dict:
    done = memfit("convert", path.name, cwd=path.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return yaml.safe_load(done.stdout)


def test_llama_factory_image_pixels_and_the_frozen_tower(tmp_path):
    path = setup(tmp_path, "sft.yaml", "model_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct\nstage: sft\nfinetuning_type: full\n"
                 "image_max_pixels: 262144\ncutoff_len: 1024\nper_device_train_batch_size: 1\nbf16: true\n")
    training = converted(path)["training"]
    # image_min_pixels at LLaMA-Factory's default (32 x 32); freeze_vision_tower at its default (true)
    assert (training["image_max_pixels"], training["image_min_pixels"], training["freeze_vision_tower"]) == (262144, 1024, True)
    done = memfit("check", "--format", "json", path.name, "--device", "H200", cwd=tmp_path)
    file = json.loads(done.stdout)["files"][0]
    assert done.returncode == 0 and file["footprint"]["activations"] > 0, done.stdout
    (tmp_path / "sft.yaml").write_text(path.read_text() + "freeze_vision_tower: false\n")
    assert converted(path)["training"]["freeze_vision_tower"] is False


def test_llama_factory_keys_wait_for_a_vision_model(tmp_path):
    shutil.copy(ROOT / "examples" / "models" / "llama-3-8b.json", tmp_path / "llama.json")
    (tmp_path / "memfit.toml").write_text('[models]\n"meta-llama/Meta-Llama-3-8B" = "llama.json"\n')
    (tmp_path / "sft.yaml").write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\nfinetuning_type: full\nimage_max_pixels: 262144\n")
    training = converted(tmp_path / "sft.yaml")["training"]
    assert not {"image_max_pixels", "image_min_pixels", "freeze_vision_tower"} & set(training)


def test_axolotl_image_size_is_width_then_height(tmp_path):
    path = setup(tmp_path, "axolotl.yml", "base_model: Qwen/Qwen2.5-VL-7B-Instruct\nsequence_len: 2048\nmicro_batch_size: 1\n"
                 "bf16: true\nimage_size: [640, 480]\n")
    assert converted(path)["training"]["image_size"] == [480, 640]
    (tmp_path / "axolotl.yml").write_text(path.read_text().replace("[640, 480]", "512"))
    assert converted(path)["training"]["image_size"] == 512
