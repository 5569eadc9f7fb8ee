"""Training data on disk: token files, their sidecars, and ``planc prepare``.

This half needs numpy but never torch, so ``planc check`` can read a token file's sidecar (or
scan its largest id) to check the vocabulary; the run-time data sources that cut batches out of
these files live in :mod:`planc.runtime.token_data`.
"""
