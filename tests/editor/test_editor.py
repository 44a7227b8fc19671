"""editor.py without a client: the layer views from the real layer model's rows, and the
completion contexts."""

from __future__ import annotations

from memfit.check.pipeline import check
from memfit.editor.editor import Analysis, completion_context, split_lines

MODEL = """\
memfit: 1
optimizer: adam
device: {memory: 1 GiB}
model:
  input_shape: [80, 80, 4]
  batch_size: 32
  layers:
    - {type: Conv2D, filters: 32, kernel_size: [8, 8], strides: [4, 4], padding: same}
    - {type: ReLU}
"""


def test_layer_hover_and_hint_read_the_row():
    result = check(MODEL, "model.yaml")
    assert result.diagnostics == []
    view = Analysis(MODEL, result)
    line = MODEL.splitlines()[7]
    hover = view.hover(7, line.index("filters"))
    assert hover.markdown.splitlines() == [
        "**layer 0**: Conv2D `conv2d`",
        "- output shape: [32, 20, 20, 32]",
        "- parameters: 8,224",
        "- weights in training: 32.13 KiB parameter + 32.13 KiB gradient + 64.25 KiB optimizer state = 128.50 KiB",
        "- saved for backward (tensors first kept by this layer): 3,276,800 B (3.13 MiB)",
    ]
    assert (hover.range.start_character, hover.range.end_character) == (line.index("{"), len(line))
    hints = view.hints(7, 8)
    assert [(h.line, h.character, h.label) for h in hints] == [
        (7, len(line), "→ [32, 20, 20, 32], 8,224 params"),
        (8, len(MODEL.splitlines()[8]), "→ [32, 20, 20, 32]"),  # no parameters: no count
    ]


def test_completion_contexts():
    text = """\
memfit: 1
dtypes:
  parameters: bf
  activations:
parameters:
  - {shape: [2], dtype: fl
device:
  memory: 24 G
  reserve: 10
name: ad
"""
    lines = split_lines(text)

    def at_end(line: int):
        return completion_context(lines, line, len(lines[line]))

    assert at_end(2) == ("dtype", 14)  # block mapping under dtypes:, replacing 'bf'
    assert at_end(5) == ("dtype", len(lines[5]) - 2)
    assert at_end(7) == ("unit", len(lines[7]) - 1)  # replacing 'G'
    assert at_end(8) == ("unit", len(lines[8]))  # nothing typed yet after the number
    assert at_end(9) is None  # name is free text
    assert at_end(4) is None  # the top-level parameters key is not a dtype
    assert completion_context(lines, 99, 0) is None
