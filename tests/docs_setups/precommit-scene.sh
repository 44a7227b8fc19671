# Shared by the precommit-* setups (docs/pre-commit.md's scenes): a user's repository with memfit's
# pre-commit hook installed and a 1.3B fine-tune config for a 24 GiB card staged. sourced by each
# setup.sh with BATCH (the activations' batch) and ARGS (the hook's args, YAML flow list) set.
#
# The hook is memfit's own definition (.pre-commit-hooks.yaml: its name, entry, file types, require_serial)
# as a `repo: local` hook run from PATH (`language: system`), so the scene needs neither the network nor a
# clone: the lines it prints are the hook's. tests/project/test_precommit_docs.py commits the same files through the
# real hook (`repo:` + `rev:`, pre-commit building its virtualenv) and compares the lines.
git init -q -b main .
"$MEMFIT_PYTHON" - "$MEMFIT_ROOT/.pre-commit-hooks.yaml" "${ARGS:-}" > .pre-commit-config.yaml <<'PY'
import sys, yaml
(hook,) = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
lines = ["repos:", "  - repo: local", "    hooks:", f"      - id: {hook['id']}", f"        name: {hook['name']}",
         f"        entry: {hook['entry']}", "        language: system", f"        types_or: [{', '.join(hook['types_or'])}]",
         f"        require_serial: {str(hook['require_serial']).lower()}"]
if sys.argv[2]:
    lines.append(f"        args: {sys.argv[2]}")
print("\n".join(lines))
PY
mkdir -p configs
cat > configs/finetune.yaml <<YAML
memfit: 1
name: finetune-1.3b
device:
  name: RTX 4090
  memory: 24 GiB
  reserve: 1 GiB
optimizer: adamw
dtypes: {parameters: bfloat16, gradients: bfloat16, activations: bfloat16, optimizer_state: float32}
parameters:
  # a 1.3B decoder: 24 layers of 2048-wide attention and MLP, a 50k vocabulary
  - {name: embed.weight, shape: [50304, 2048]}
  - {name: layers.*.attn.weight, shape: [2048, 8192], count: 24}
  - {name: layers.*.mlp.weight, shape: [2048, 16384], count: 24}
activations:
  # what each layer keeps for the backward, for $BATCH sequences of 2048 tokens
  - {name: layers.*.saved, shape: [$BATCH, 2048, 16384], count: 24}
YAML
cat > docker-compose.yml <<'YAML'
services:
  tensorboard:
    image: tensorflow/tensorflow:2.17.0
    command: tensorboard --logdir /runs --bind_all
YAML
"$MEMFIT_PYTHON" -m pre_commit install > /dev/null
git add .pre-commit-config.yaml configs docker-compose.yml  # not setup.sh: sync_docs deletes it after the run
