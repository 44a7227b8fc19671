# docs/pre-commit.md: the same commit at batch 4 (the scene: ../precommit-scene.sh)
BATCH=4 ARGS= source "$MEMFIT_ROOT/tests/docs_setups/precommit-scene.sh"
