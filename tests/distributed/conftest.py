def pytest_terminal_summary(terminalreporter):
    """Print the equivalence matrix (case -> max |loss - reference|, max relative difference of the
    gradient norm) and each launch's wall time."""
    try:
        from test_equivalence import LAUNCH_SECONDS, MATRIX, NORMS
    except ImportError:
        return
    if not MATRIX and not LAUNCH_SECONDS:
        return
    terminalreporter.section("equivalence matrix")
    for name, difference in MATRIX.items():
        norm = f"  max |dnorm| / norm = {NORMS[name]:.1e}" if name in NORMS else ""
        terminalreporter.write_line(f"{name:40s} max |dloss| = {difference:.2e}{norm}")
    for world, seconds in sorted(LAUNCH_SECONDS.items()):
        terminalreporter.write_line(f"torchrun --nproc-per-node {world}: {seconds:.1f} s")
