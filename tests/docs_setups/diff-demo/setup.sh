# docs/fit-and-diff.md's `memfit diff` scene: a repository holding memfit's examples at HEAD, then, in the working
# tree, the text encoder's batch doubled with its activations in float32, the Atari CNN on SGD instead of Adam,
# and the CIFAR example deleted.
cp -r "$MEMFIT_ROOT/examples" examples
git init -q -b main .
git add examples
git commit -q -m "the examples"
sed -i 's/^  batch_size: 64$/  batch_size: 128/; s/^  activations: bfloat16 /  activations: float32  /' examples/text-encoder.yaml
sed -i 's/^optimizer: adam$/optimizer: sgd/' examples/atari-cnn.yaml
rm examples/cifar-cnn.yaml
git diff --quiet examples/text-encoder.yaml && { echo "the text encoder's edit did not apply" >&2; exit 1; }
git diff --quiet examples/atari-cnn.yaml && { echo "the Atari CNN's edit did not apply" >&2; exit 1; }
exit 0
