"""Training techniques: each one a rewrite of the step's program (ledger.step.Step), one module each.

A technique module holds everything about its technique: its `training` keys (KEYS: the schema properties,
merged into the schema by cli/schemagen.py), whether a config switches it on (`applies`), its refusals
(`problems`), and the rewrite itself (`rewrite`: a Step in, a Step out). ledger/rewrites.py applies them, in
the order of its TECHNIQUES, to every program the ledger builds (the single device's and each rank's).
"""
