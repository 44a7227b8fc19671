"""A Keras merge over N branches costs operations in proportion to N (issue 33: an `Add` over 12,000 branches took
over 10 s, the step's in-flight sums scanning every tensor at every row). Counted, not timed: the function calls of
`memfit check` at N and 2N branches."""

import cProfile
import pstats

from memfit.check.pipeline import check


def config(branches: int) -> str:
    lines = ["memfit: 1", "device: {memory: 80 GB}", "optimizer: adam", "model:", "  input_shape: [16]", "  batch_size: 4", "  layers:",
             "    - {name: inp, type: Dense, units: 16}"]
    lines += [f"    - {{name: b{i}, type: Dense, units: 16, inputs: [inp]}}" for i in range(branches)]
    lines.append("    - {name: sum, type: Add, inputs: [" + ", ".join(f"b{i}" for i in range(branches)) + "]}")
    lines.append("training: {micro_batch: 4}")
    return "\n".join(lines) + "\n"


def calls(branches: int) -> tuple[int, int]:
    text = config(branches)
    check(text, "merge.yaml")  # imports and compiled schema out of the count
    profile = cProfile.Profile()
    profile.enable()
    result = check(text, "merge.yaml")
    profile.disable()
    return pstats.Stats(profile).total_calls, result.peak["bytes"]


def test_an_add_over_n_branches_is_linear_in_n():
    small, peak_small = calls(500)
    large, peak_large = calls(2000)
    assert large < 4.4 * small  # 4x the branches: about 4x the calls (quadratic was about 13x)
    # each branch adds the same bytes to the peak: its Dense layer's weights, gradients, state and output
    assert (peak_large - peak_small) % 1500 == 0
