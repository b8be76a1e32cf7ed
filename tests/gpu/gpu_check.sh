#!/usr/bin/env bash
# `make gpu-check`: the GPU-only tests (real Triton launches, CUDA graphs, speed against torch.compile,
# printed) and then `make bench`, in under 8 minutes on one GPU. Run it where a CUDA device exists.
set -u
cd "$(dirname "$0")/../.."
PY=${VPY:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing to run"; exit 1
fi
"$PY" -c "import triton" 2>/dev/null || "$PY" -m pip install -q triton==3.9.0
status=0
# the GPU tests: 4 minutes at most (each Triton kernel compiles once, about a second)
timeout 240 "$PY" -m pytest -q -m gpu tests/gpu -s -p no:cacheprovider --timeout=200 || status=$?
# the benchmark suite (its workloads run on CPU tensors today), quick sizes, no cold-start subprocesses
timeout 200 "$PY" -m benchmarks.run --quick --no-startup || status=$?
exit $status
