"""``planc verify``: run the emitted program with measurement around its steps and hold each
measured number beside the cost model's prediction.

Run-time half (imports torch; loaded by the program only when ``PLANC_VERIFY`` is set):
:mod:`.probe` (the hook the training loop installs), :mod:`.comm_counter`,
:mod:`.saved_activations`, :mod:`.model_states`. Plan-time half (no torch): :mod:`.predicted`,
:mod:`.report`, :mod:`.results`.
"""
