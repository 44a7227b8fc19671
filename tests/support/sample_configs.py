"""Configs several stages' tests share."""

# A Keras-form config over its 2 MiB budget at batch 512 (tests/whatif/test_fit.py checks the arithmetic against
# memfit check; tests/editor/test_lsp_fixes.py offers its fixes in the editor).
KERAS = """\
memfit: 1
device: {memory: 2 MiB}
optimizer: adam  # keep this comment
model:
  input_shape: [256]
  batch_size: 512
  layers:
    - {type: Dense, units: 256, activation: relu}
    - {type: Dense, units: 10}
"""
