def pytest_terminal_summary(terminalreporter):
    """Print the equivalence matrix (case -> max |loss - reference|) and each launch's wall time."""
    try:
        from test_equivalence import LAUNCH_SECONDS, MATRIX
    except ImportError:
        return
    if not MATRIX and not LAUNCH_SECONDS:
        return
    terminalreporter.section("equivalence matrix")
    for name, difference in MATRIX.items():
        terminalreporter.write_line(f"{name:40s} max |dloss| = {difference:.2e}")
    for world, seconds in sorted(LAUNCH_SECONDS.items()):
        terminalreporter.write_line(f"torchrun --nproc-per-node {world}: {seconds:.1f} s")
