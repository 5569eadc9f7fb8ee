"""The calibration's guard against a disturbed wrapper measurement (planc.calibrate.timing.beyond_parts)."""

from planc.calibrate.timing import ATTEMPTS, beyond_parts


def test_a_total_no_larger_than_its_parts_is_measured_again():
    readings = iter([(1.0, 2.0), (2.0, 2.0), (5.0, 2.0), (9.0, 2.0)])
    calls = []

    def measure():
        calls.append(1)
        return next(readings)

    assert beyond_parts(measure) == 3.0  # the third reading, 5 - 2; the first two were not above their parts
    assert len(calls) == 3


def test_after_the_attempts_the_cost_is_zero():
    calls = []

    def measure():
        calls.append(1)
        return 1.0, 1.5

    assert beyond_parts(measure) == 0.0 and len(calls) == ATTEMPTS
