# docs/pre-commit.md: the first commit, at batch 8 (the scene: ../precommit-scene.sh)
BATCH=8 ARGS= source "$MEMFIT_ROOT/tests/docs_setups/precommit-scene.sh"
