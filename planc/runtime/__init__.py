"""The layout-independent run-time pieces: model, data, optimizer, metrics, checkpoints, reference trainer.

These modules import torch; the light half of planc (spec, planner, explain) never imports them.
"""
