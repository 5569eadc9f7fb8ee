"""``planc calibrate``: micro-benchmarks of the machine it runs on, written as a hardware profile.

One module per measurement — :mod:`.gemm`, :mod:`.attention`, :mod:`.memory_bw`,
:mod:`.dispatch`, :mod:`.collectives` — timed the same way (:mod:`.timing`), put together by
:mod:`.worker` (the program torchrun starts on every rank) into the schema of
:mod:`planc.spec.hardware_profile`. Which shapes and sizes to measure comes from a plan when one is
given (:mod:`.shapes`). docs/calibrate.md says what each number means and how the cost model uses it.
"""
