"""Model derivations: a declared model section -> the tensors training keeps.

Each kind of model is one module here (keras.py: a Keras-style layer stack; hf.py with
families/, hf_config.py and hf_activations.py: a transformer from a Hugging Face config.json);
dispatch.derive picks the one the document asks for. This file imports nothing: the modules
import each other, and a package that imported them would close a cycle through itself.
"""
