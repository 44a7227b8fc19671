"""The tests mirror src/memfit/: tests/<stage>/ holds the tests of src/memfit/<stage>/ (tests/project/ those of the
repository as a whole: layout, docs, benchmarks). tests/support/ holds what several stages' tests share (the
framework measurements, `needs`); it is put on the import path here so that a test imports it by name.
"""

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
