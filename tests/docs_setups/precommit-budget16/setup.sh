# docs/pre-commit.md: batch 4 held to 16 GiB by the hook's args (the scene: ../precommit-scene.sh)
BATCH=4 ARGS="[--budget, 16GiB]" source "$MEMFIT_ROOT/tests/docs_setups/precommit-scene.sh"
