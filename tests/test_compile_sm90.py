"""Every generated kernel compiles to a Hopper (sm_90) cubin, even on a machine without a GPU."""
import json
import os
import subprocess
import sys
import warnings

import triton

from tests.harness import ROOT, LAYOUTS


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.compile_sm90"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in records if not r["ok"]]
    assert not failed, failed
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["layout"] for r in records} == set(LAYOUTS)
    # No kernel may spill registers to local memory, unless a spec caps its registers (the append's
    # lone_registers, tuned with the H200's Triton 3.6, under which the variant decode steps run fits
    # the cap without spills; other variants and releases may not): those spills are reported, not failed.
    spilled = [r for r in records if (r["spill_stores"] or r["spill_loads"]) and "maxnreg" not in r]
    assert not spilled, spilled
    for r in records:
        if "maxnreg" in r and (r["spill_stores"] or r["spill_loads"]):
            warnings.warn(f"{r['layout']}.{r['kernel']} (page {r['page']}) spills {r['spill_stores']} bytes under "
                          f"its register cap of {r['maxnreg']} with Triton {triton.__version__}")
