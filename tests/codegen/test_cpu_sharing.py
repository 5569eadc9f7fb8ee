"""`planc run` of a CPU plan with more processes than cores says what to expect of the prediction."""

from planc.launch import cpu_sharing_note
from planc.spec import build_plan


def cpu_plan(per_node: int, device: str = "cpu"):
    return build_plan(
        {
            "model": dict(layers=2, hidden=32, heads=2, vocab=64, seq_len=16),
            "hardware": {"device": device, "per_node": per_node},
            "train": dict(global_batch=per_node, micro_batch=1, steps=2),
        }
    )


def test_more_processes_than_cores_get_a_note_naming_the_calibration():
    note = cpu_sharing_note(cpu_plan(8), cores=2)
    assert note is not None
    assert note.startswith("8 processes share this machine's 2 core(s)")
    assert "planc calibrate --cpu --nproc 8 --plan FILE" in note
    assert 'profile = "cpu.json"' in note


def test_no_note_where_each_process_has_a_core_a_profile_measured_it_or_the_plan_is_for_gpus():
    assert cpu_sharing_note(cpu_plan(2), cores=2) is None
    assert cpu_sharing_note(cpu_plan(4), cores=16) is None
    plan = cpu_plan(8)
    measured = plan.model_copy(update={"hardware": plan.hardware.model_copy(update={"profile": "cpu.json"})})
    assert cpu_sharing_note(measured, cores=2) is None
    assert cpu_sharing_note(cpu_plan(8, device="H100-SXM"), cores=2) is None
