"""Named models and devices a ``.plan`` can refer to (``preset = "llama3-8b"``, ``device = "H100-SXM"``)."""

from planc.spec.presets.hardware import HARDWARE_PRESETS
from planc.spec.presets.models import MODEL_PRESETS

__all__ = ["HARDWARE_PRESETS", "MODEL_PRESETS"]
