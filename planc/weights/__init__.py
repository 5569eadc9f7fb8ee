"""Weights in and out: Hugging Face safetensors to planc's model, and planc checkpoints to Hugging Face.

Torch-free (imported by ``planc check``): :mod:`~planc.weights.hf_names` (which Hugging Face
tensor holds each planc parameter, and how its rows are laid out), :mod:`~planc.weights.hf_configs`
(the ``config.json`` of an export; what a Hugging Face config has that planc does not build),
:mod:`~planc.weights.safetensors_index` (tensor names and shapes from safetensors headers) and
:mod:`~planc.weights.plan_checks` (the ``init = pretrained`` checks of a plan).

With torch: :mod:`~planc.weights.import_hf` (fill a model's local shards from safetensors) and
:mod:`~planc.weights.export` (a DCP checkpoint to Hugging Face safetensors or one torch state dict).
See docs/weights.md.
"""
