"""Test setup: without CUDA, kernels run in Triton's stock interpreter (generated kernels convert
exactly there themselves; the one patch below saves time and changes no byte)."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"   # must precede the first import of a kernel module
    from tests import interpreter_patch_once

    interpreter_patch_once.install()     # speed only: see its docstring
DEVICE = "cuda" if ON_GPU else "cpu"


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Every test starts without launch plans (a test may change LAUNCH or monkeypatch helpers that
    a plan of an earlier test would bypass)."""
    for mod in list(sys.modules.values()):
        if "_PLANS" in getattr(mod, "__dict__", {}) and "clear_plans" in mod.__dict__:
            mod.clear_plans()
    yield


# --- The sm_90 compile job ---------------------------------------------------------------------------
# `python -m tests.compile_sm90` (compiling every kernel for Hopper, ~1.5 min on one core) is a process of
# its own. When its test is collected it starts at once and the test moves to the end of the run, so on
# CI's two cores it compiles while the interpreter runs the other tests.
COMPILE_SM90_TEST = "test_every_kernel_compiles_for_sm90"
COMPILE_SM90_TIMEOUT_S = 900
_compile_sm90_job = None


def _start_compile_sm90() -> subprocess.Popen:
    """The job, its output going to files (a pipe read only at the end would stall it when full)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    output = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
    job = subprocess.Popen([sys.executable, "-m", "tests.compile_sm90"], cwd=ROOT, env=env,
                           stdout=output[0], stderr=output[1], text=True)
    job.output_files = output
    return job


def pytest_collection_modifyitems(config, items):
    global _compile_sm90_job
    compile_tests = [item for item in items if item.name == COMPILE_SM90_TEST]
    if compile_tests and _compile_sm90_job is None:
        items[:] = [item for item in items if item.name != COMPILE_SM90_TEST] + compile_tests
        _compile_sm90_job = _start_compile_sm90()


def pytest_sessionfinish(session, exitstatus):
    if _compile_sm90_job is not None and _compile_sm90_job.poll() is None:
        _compile_sm90_job.kill()     # a run stopped early (-x, Ctrl-C) leaves no compiler behind
        _compile_sm90_job.wait()


@pytest.fixture
def compile_sm90_result() -> subprocess.CompletedProcess:
    """The compile job's exit status and output (started here if collection did not start it)."""
    job = _compile_sm90_job or _start_compile_sm90()
    job.wait(timeout=COMPILE_SM90_TIMEOUT_S)
    for f in job.output_files:
        f.seek(0)
    stdout, stderr = (f.read() for f in job.output_files)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
