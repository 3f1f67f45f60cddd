#!/usr/bin/env bash
# One device session: the test suite on the GPU, then the benchmarks (GPU time, host time); scratch/ seed comparisons
# (parity and side-by-side timing, not committed) run too when present. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvlayout-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
step() { local name=$1; shift; local t0=$SECONDS; "$@" >"$OUT/$name.txt" 2>&1; local rc=$?
         echo "== $name: rc=$rc in $((SECONDS - t0)) s"; tail -n "${TAIL:-40}" "$OUT/$name.txt"; }
[ "${SKIP_TESTS:-0}" = 1 ] || TAIL=6 step tests python3 -m pytest -q -x tests
[ -f scratch/parity.py ] && step parity python3 scratch/parity.py
[ "${SKIP_BENCH:-0}" = 1 ] || step bench python3 -m bench.run --json "$OUT/bench.json" ${BENCH_ARGS:-}
# host time per eager call; SEEDS=DIR (a copy of the seed files in the repo, e.g. scratch/seeds) adds the seeds
[ "${SKIP_BENCH:-0}" = 1 ] || step host python3 -m bench.host --json "$OUT/host.json" ${SEEDS:+--seeds "$SEEDS"}
[ -f scratch/seed_bench.py ] && step seed_bench python3 scratch/seed_bench.py
exit 0
