"""`pip install planc` without torch: the planner's commands work, the runtime's say how to install it.

Each command runs in a fresh interpreter whose ``sitecustomize`` puts a meta-path finder in front
of every other that refuses ``torch`` (and ``safetensors``): ``import torch`` raises
ModuleNotFoundError exactly as in an environment without it, however deep in planc the import is.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist(launches=False)  # every test starts interpreters (none trains)

ROOT = Path(__file__).resolve().parent.parent

BLOCKER = textwrap.dedent(
    """
    import sys

    class _NoTorch:
        BLOCKED = ("torch", "safetensors")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _NoTorch())
    """
)


@pytest.fixture
def planc_without_torch(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)

    def run(*argv):
        env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        return subprocess.run(
            [sys.executable, "-m", "planc", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )

    return run


def test_the_blocker_blocks(planc_without_torch, tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-c", "import torch"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "blocked by the test" in result.stderr


def test_check_fmt_explain_compile_presets_docs_need_no_torch(planc_without_torch, tmp_path):
    for argv in (
        ["check", "plans/tiny-cpu.plan", "plans/from-hf-config.plan"],
        ["fmt", "--check", "plans/tiny-cpu.plan"],
        ["explain", "plans/llama3-70b-64xh100.plan"],
        ["compile", "plans/cpu-3d.plan", "-o", str(tmp_path / "train.py")],
        ["presets"],
        ["docs", "weights"],
        ["plugins"],
    ):
        result = planc_without_torch(*argv)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, argv
    assert "torchrun --standalone --nproc-per-node 8 train.py" in (tmp_path / "train.py").read_text()
    presets = planc_without_torch("presets").stdout
    assert "llama3-8b" in presets and "8,030,261,248" in presets and "H100-SXM" in presets


def test_run_and_export_say_how_to_install_the_runtime(planc_without_torch, tmp_path):
    for argv in (
        ["run", "plans/tiny-cpu.plan", "--out", str(tmp_path / "run")],
        ["export", str(tmp_path / "run"), "--to", str(tmp_path / "hf")],
    ):
        result = planc_without_torch(*argv)
        assert result.returncode == 1, (argv, result.stderr[-2000:])
        assert "needs torch, which is not installed" in result.stderr, argv
        assert "pip install 'planc[run]'" in result.stderr and "Traceback" not in result.stderr


def test_an_installed_wheel_checks_without_torch_and_carries_its_docs(tmp_path):
    """Build the wheel, install it into a fresh environment (no torch there; the dependencies come
    from this one's site-packages, torch blocked), and run it from outside the checkout."""
    import importlib.util
    import shutil
    import sysconfig

    if importlib.util.find_spec("setuptools") is None:  # the build backend, used without isolation (offline)
        pytest.skip("setuptools is not installed here, so the wheel cannot be built without a download")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("planc", "docs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."]
    subprocess.run(build, cwd=source, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("planc-*.whl")
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {"PYTHONPATH": f"{site}:{sysconfig.get_path('purelib')}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    shutil.copy(ROOT / "plans" / "tiny-cpu.plan", tmp_path / "tiny.plan")

    def planc(*argv):
        return subprocess.run(
            [str(python), "-m", "planc", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    where = planc("docs", "weights", "--path")
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip() == str(env_dir / "share" / "planc" / "docs" / "weights.md")
    listing = planc("docs").stdout
    assert "getting-started" in listing and "gpu" in listing and "course/08-tensor-parallel" in listing
    assert "planc docs" in planc("--help").stdout
    checked = planc("check", "tiny.plan")
    assert checked.returncode == 0 and "ok" in checked.stdout, checked.stderr
    ran = planc("run", "tiny.plan")
    assert ran.returncode == 1 and "pip install 'planc[run]'" in ran.stderr
