"""Every generated kernel compiles to a Hopper (sm_90) cubin, even on a machine without a GPU."""
import json
import warnings

import triton

from tests.harness import LAYOUTS


def test_every_kernel_compiles_for_sm90(compile_sm90_result):
    """Runs last: its job (`python -m tests.compile_sm90`) starts at collection (see conftest.py)."""
    proc = compile_sm90_result
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
