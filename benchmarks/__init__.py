"""Kiln's benchmark suite, run by `make bench` (`python -m benchmarks.run`).

One module per workload; each builds a `Case` (benchmarks.workload). benchmarks.run times every
case under eager, Kiln's default backend and the real torch.compile in one process, measures cold and
warm compile times in fresh subprocesses (benchmarks.startup), and writes bench_results.json.
"""
