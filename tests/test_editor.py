"""editor.py without a client: the layer views against a row shaped as the layer model's
(a stand-in until memfit.layers lands; the end-to-end layer test in test_lsp.py runs then),
and the completion contexts."""

from __future__ import annotations

from types import SimpleNamespace

from memfit import config, source
from memfit.check import Result
from memfit.editor import Analysis, completion_context, split_lines

MODEL = """\
memfit: 1
optimizer: adam
model:
  layers:
    - {type: Conv2D, filters: 32, kernel_size: [8, 8], strides: [4, 4], padding: same}
    - {type: ReLU}
"""


def analysis_with_layer_rows() -> Analysis:
    data = source.load(MODEL).data
    built, _ = config.build(data)
    built.footprint = config.footprint(built)
    # a stand-in row with the layer model's attributes (path, output_shape, params, saved_bytes)
    built.layers = [
        SimpleNamespace(path=("model", "layers", 0), output_shape=[32, 20, 20, 32], params=8224, saved_bytes=3_276_800),
        SimpleNamespace(path=("model", "layers", 1), output_shape=[32, 20, 20, 32], params=0, saved_bytes=1_638_400),
    ]
    return Analysis(MODEL, Result("model.yaml", config=built, data=data))


def test_layer_hover_and_hint_read_the_row():
    view = analysis_with_layer_rows()
    hover = view.hover(4, MODEL.splitlines()[4].index("filters"))
    assert hover.markdown.splitlines() == [
        "**layer 0**: Conv2D",
        "- output shape: [32, 20, 20, 32]",
        "- parameters: 8,224",
        "- saved for backward (tensors first kept by this layer): 3,276,800 B (3.13 MiB)",
    ]
    line4 = MODEL.splitlines()[4]
    assert (hover.range.start_character, hover.range.end_character) == (line4.index("{"), len(line4))
    hints = view.hints(4, 5)
    assert [(h.line, h.character, h.label) for h in hints] == [
        (4, len(line4), "→ [32, 20, 20, 32], 8,224 params"),
        (5, len(MODEL.splitlines()[5]), "→ [32, 20, 20, 32]"),  # no parameters: no count
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
