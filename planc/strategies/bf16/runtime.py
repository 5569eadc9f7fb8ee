"""Run-time half of ``bf16`` (imports torch): the mixed-precision policy the job hands on."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from planc.runtime.job import Job


def offer_bf16(job: Job, *, reduce_in_fp32: bool) -> None:
    """bf16 compute copies of fp32 parameters, gradients reduced in fp32 (or bf16); the forward is
    autocast to bf16 unless a later strategy (FSDP2) takes the policy."""
    reduce_dtype = torch.float32 if reduce_in_fp32 else torch.bfloat16
    job.offer_mixed_precision(
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype), torch.bfloat16
    )
