"""Native configs: the files that launch the runs (Axolotl, LLaMA-Factory, torchtune, the Hugging
Face Trainer's argument files, DeepSpeed JSON, accelerate launch configs, LitGPT's finetune configs), read in place.

Each format's module turns the native file into the memfit config it means (the same document a
memfit YAML would load to) and a map from each memfit key path back to the native node it comes
from; the pipeline computes every figure from that document, and each diagnostic is placed on
the native key (`position.place`). Formats are told apart by their keys (DETECT), or named
with `--input-format`.
"""

# the formats memfit reads (the choices of --input-format); here, not in base, so that the CLI's
# parser names them without importing the readers
FORMATS = ("memfit", "axolotl", "llama-factory", "torchtune", "hf-trainer", "deepspeed", "accelerate", "litgpt")
