# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-all bench bench-models gpu-check clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch==2.13.0 is pinned so pip takes the CPU wheel; never a looser range (that pulls a CUDA build)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	# the boundary extension (native guards and plans), built once per torch and Python into the
	# default cache, so a new user's first process already runs hot graphs natively; not fatal
	-$(VPY) -m kiln boundary
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VPY) -m examples.demo

test: $(STAMP)
	$(VPY) -m mypy  # pyproject.toml's [tool.mypy]: all of kiln/ at zero errors
	# two worker processes (CI has 2 cores), ~10150 tests; the budget is 20 min on a clean clone (cold kernel
	# cache). At 0165a9a: 598 s of pytest with a warm kernel cache; 1142 s cold (at 536d89f, two test-side mends before) (quiet machine; stop 44's CI run took 1305 s in all). What keeps
	# it short (README, `make test`): product sweeps run the fixed ci_slice star, the rest is `-m slow` (make
	# test-all); torch.compile's answers on the two corpora are recorded (tests/recorded_oracle.py); the native
	# wrapper's cache test starts on a cache seeded with the boundary extension and the precompiled header
	# (tests/reliability/cache_harness.seed); no file of minutes runs alone at the end (test_split_cache is two).
	# --dist loadfile: each test file runs on one worker, in file order as plain `pytest` runs it, so a
	# module-scoped fixture (a filled cache, a pair of processes, the DDP run) is made once, not once per
	# worker. (loadgroup's xdist_group marks do nothing under pytest 9: xdist 3.8 renames item._nodeid.)
	$(VPY) -m pytest -q -n 2 --dist loadfile

test-all: $(STAMP)
	$(VPY) -m pytest -q -m 'not gpu' --timeout=1800

bench: $(STAMP)
	$(VPY) -m benchmarks.run

# the real-model corpus (tests/e2e/real_models.py): speedups, first-call and warm-start seconds of Kiln
# and torch.compile over eager, with geomeans; ARGS="--quick" or ARGS="--only gpt2,bert" for less
bench-models: $(STAMP)
	$(VPY) -m benchmarks.models $(ARGS)

# on a machine with a CUDA device: GPU tests (Triton launches, CUDA graphs, speed) + a quick bench, < 8 min
gpu-check: $(STAMP)
	VPY=$(VPY) tests/gpu/gpu_check.sh

clean:
	rm -rf $(VENV) kiln_debug .kiln_cache build *.egg-info
