"""Failures a user can act on are explained in one line; others keep their traceback."""

import torch

from planc.runtime.failures import describe_failure

GLOO_PEER_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:5309. This is typically caused by a remote worker crashing. Check the logs"
)


def test_lost_peer_is_named_without_glooisms():
    message = describe_failure(RuntimeError(GLOO_PEER_GONE), rank=2, step=4)
    assert message.startswith("rank 2: lost contact with another rank in step 4")
    assert message.endswith("Connection closed by peer [127.0.0.1]:5309")
    assert "pair.cc" not in message
    assert "its own message, if any, is above" in message


def test_the_recorded_line_points_nowhere_above():
    """planc doctor lists the heartbeat's copy among every rank's lines: "above" would mislead there."""
    recorded = describe_failure(RuntimeError(GLOO_PEER_GONE), rank=2, step=4, printed=False)
    assert recorded.startswith("rank 2: lost contact with another rank in step 4")
    assert "(a peer process crashed or was killed): " in recorded
    assert "above" not in recorded


def test_out_of_memory_points_at_explain():
    message = describe_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), rank=0, step=1)
    assert "rank 0: out of device memory in step 1" in message and "planc explain" in message


def test_other_errors_are_not_explained():
    assert describe_failure(ValueError("a bug"), rank=0, step=1) is None
    assert describe_failure(RuntimeError("shape mismatch"), rank=0, step=1) is None
