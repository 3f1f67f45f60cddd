"""`make test`: the suite as two pytest processes at once where the machine has two CPUs or more.

The interpreted kernel tests (tests/test_kernels.py, with tests/test_given_scales.py and the
smaller tests/test_numerics.py and tests/test_compat.py) take about half the suite's time, so they
run beside everything else, less the dense dequantize tests, which join the other process: the two
take about as long. Each process's output is printed when it ends, and the exit status is the first failing
process's (0 when both pass; a process that selects no test, as with -k, fails only if the other
selects none either). With one CPU it is plain `pytest -q`. Extra arguments go to both processes,
e.g. `python -m tests.run -x`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "tests/test_kernels.py"
NO_TESTS = 5                  # pytest's exit status when a process selects no test
MOVED = tuple(f"{KERNELS}::{test}" for test in ("test_dequantize",))
BESIDE = ("tests/test_given_scales.py", "tests/test_numerics.py", "tests/test_compat.py")   # whole files run with them


def groups() -> tuple:
    """The two processes' pytest arguments: every test once."""
    others = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py"))
    kernels = [KERNELS, *BESIDE, *(arg for test in MOVED for arg in ("--deselect", f"{test}["))]
    return kernels, [*(p for p in others if p != KERNELS and p not in BESIDE), *MOVED]


def main(extra: list) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cpus < 2:                   # (the CPUs this process may run on, not the host's)
        return subprocess.call([sys.executable, "-m", "pytest", "-q", *extra], cwd=ROOT)
    jobs = []
    try:
        for group in groups():
            log = tempfile.TemporaryFile("w+")
            jobs.append((group, log, subprocess.Popen([sys.executable, "-m", "pytest", "-q", *group, *extra],
                                                      cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)))
        codes = []
        for i, (group, log, job) in enumerate(jobs):
            codes.append(job.wait())
            log.seek(0)
            print(f"==== pytest process {i + 1} of {len(jobs)} ({group[0]}{', ...' if len(group) > 1 else ''}): "
                  f"exit {codes[-1]}", flush=True)
            sys.stdout.write(log.read())
            sys.stdout.flush()
    finally:
        for _, log, job in jobs:      # an interrupted run leaves no pytest behind
            if job.poll() is None:
                job.kill()
                job.wait()
            log.close()
    return status(codes)


def status(codes: list) -> int:
    """The run's exit status from the processes': the first failure's, where a process that selected
    no test (pytest's 5, as with -k or a node id) fails only if every process selected none."""
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    return next((code for code in codes if code not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
