"""Sub-commands of the ``planc`` CLI, one module each (see :mod:`planc.cli`)."""
