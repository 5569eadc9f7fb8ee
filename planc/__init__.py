"""planc — a declarative parallel-plan compiler for training large language models.

The package has a light half (``dsl``, ``spec``, ``hardware``, ``cost``, ``planner``,
``explain``) that never imports torch, and a heavy half (``runtime``, strategies' run-time
``apply``) that does. Keep it that way: ``planc check`` and ``planc explain`` must answer in
well under a second.
"""

__version__ = "0.1.0"
