"""Opt-in sweep: is a compiled small program ever slower than eager? (not part of `make bench`)

About forty programs a user would compile for inference, each a single op or a short chain
(softmax / log_softmax over several shapes and dims, layer norm, an RMS-norm chain, gelu / silu,
sum / mean / amax over inner and outer dims and over non-contiguous inputs, cumsum, argmax, topk,
sort, where, masked_fill, index_select / gather / embedding, cat / stack, transpose + contiguous,
bfloat16 variants, small and large sizes), each timed under Kiln against eager at one thread.

Time is the calling thread's CPU time (`time.thread_time`), so the other processes of a shared
machine do not count; samples of Kiln and eager are taken in turn, after warm-up and after Kiln's
tier-up (its native wrappers built), and the median per call is kept. Outputs are checked against
eager's first. Run it as

    PYTHONPATH=. python -m benchmarks.eager_floor [--only SUBSTRING ...] [--json out.json]

`make bench` does not run it (benchmarks.run lists its workloads by name); the ratio column is
eager's time over Kiln's, so a number under 1.0 is a program Kiln makes slower.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from benchmarks.compilers import KILN, settle_kiln


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    make_inputs: Callable[[], tuple]


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*sizes: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*sizes, generator=_g(seed)).to(dtype)


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _programs() -> list[Program]:
    p: list[Program] = []

    def add(name: str, fn: Callable, make_inputs: Callable[[], tuple]) -> None:
        p.append(Program(name, fn, make_inputs))

    # softmax family
    add("softmax_vocab_8x32000", lambda x: torch.log_softmax(x, -1), lambda: (_randn(8, 32000) * 3,))
    add("log_softmax_64x32000", lambda x: torch.log_softmax(x, -1), lambda: (_randn(64, 32000) * 3,))
    add("softmax_8x32000", lambda x: torch.softmax(x, -1), lambda: (_randn(8, 32000),))
    add("softmax_4096x1024", lambda x: torch.softmax(x, -1), lambda: (_randn(4096, 1024),))
    add("softmax_256x128", lambda x: torch.softmax(x, -1), lambda: (_randn(256, 128),))
    add("softmax_4x16", lambda x: torch.softmax(x, -1), lambda: (_randn(4, 16),))
    add("softmax_dim0_1024x512", lambda x: torch.softmax(x, 0), lambda: (_randn(1024, 512),))
    add("softmax_dim1_8x128x64", lambda x: torch.softmax(x, 1), lambda: (_randn(8, 128, 64),))
    add("softmax_of_transposed_1024x512", lambda x: torch.softmax(x.t() * 2.0, -1), lambda: (_randn(1024, 512),))
    add("log_softmax_512x10", lambda x: torch.log_softmax(x, -1), lambda: (_randn(512, 10),))
    add("log_softmax_512x16", lambda x: torch.log_softmax(x, -1), lambda: (_randn(512, 16),))
    add("softmax_512x10", lambda x: torch.softmax(x, -1), lambda: (_randn(512, 10),))
    add("log_softmax_dim0_512x1000", lambda x: torch.log_softmax(x, 0), lambda: (_randn(512, 1000),))
    add("softmax_bf16_64x4096", lambda x: torch.softmax(x, -1), lambda: (_randn(64, 4096, dtype=torch.bfloat16),))
    add("attn_scores_softmax", lambda q, k: torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1),
        lambda: (_randn(8, 128, 64), _randn(8, 128, 64, seed=1)))
    # norms
    add("layer_norm_512x768", lambda x, w, b: F.layer_norm(x, (768,), w, b),
        lambda: (_randn(512, 768), _randn(768, seed=1), _randn(768, seed=2)))
    add("layer_norm_4096x64", lambda x, w, b: F.layer_norm(x, (64,), w, b),
        lambda: (_randn(4096, 64), _randn(64, seed=1), _randn(64, seed=2)))
    add("layer_norm_2x32", lambda x, w, b: F.layer_norm(x, (32,), w, b),
        lambda: (_randn(2, 32), _randn(32, seed=1), _randn(32, seed=2)))
    add("layer_norm_bf16_512x768", lambda x, w, b: F.layer_norm(x, (768,), w, b),
        lambda: (_randn(512, 768, dtype=torch.bfloat16), _randn(768, dtype=torch.bfloat16, seed=1),
                 _randn(768, dtype=torch.bfloat16, seed=2)))
    add("rms_norm_512x4096", _rms_norm, lambda: (_randn(512, 4096), _randn(4096, seed=1)))
    add("rms_norm_bf16_512x4096", _rms_norm,
        lambda: (_randn(512, 4096, dtype=torch.bfloat16), _randn(4096, dtype=torch.bfloat16, seed=1)))
    # activations
    add("gelu_1M", lambda x: F.gelu(x), lambda: (_randn(1 << 20),))
    add("gelu_tanh_bf16_1M", lambda x: F.gelu(x, approximate="tanh"), lambda: (_randn(1 << 20, dtype=torch.bfloat16),))
    add("silu_mul_512x2048", lambda a, b: F.silu(a) * b, lambda: (_randn(512, 2048), _randn(512, 2048, seed=1)))
    add("silu_64", lambda x: F.silu(x), lambda: (_randn(64),))
    # reductions
    add("sum_inner_1024x1024", lambda x: x.sum(-1), lambda: (_randn(1024, 1024),))
    add("sum_outer_1024x1024", lambda x: x.sum(0), lambda: (_randn(1024, 1024),))
    add("mean_inner_4096x256", lambda x: x.mean(-1), lambda: (_randn(4096, 256),))
    add("amax_outer_1024x1024", lambda x: x.amax(0), lambda: (_randn(1024, 1024),))
    add("mean_hw_nhwc_16x3x224x224", lambda x: x.mean((2, 3)),
        lambda: (_randn(16, 3, 224, 224).contiguous(memory_format=torch.channels_last),))
    add("sum_nhw_nhwc_8x3x64x64", lambda x: x.sum((0, 2, 3)),
        lambda: (_randn(8, 3, 64, 64).contiguous(memory_format=torch.channels_last),))
    add("sum_hw_nhwc_8x8x64x64", lambda x: x.sum((2, 3)),
        lambda: (_randn(8, 8, 64, 64).contiguous(memory_format=torch.channels_last),))
    add("sum_all_1M", lambda x: x.sum(), lambda: (_randn(1 << 20),))
    add("sum_transposed_1024x1024", lambda x: x.t().sum(-1), lambda: (_randn(1024, 1024),))
    add("sum_strided_slice", lambda x: x[:, ::2].sum(-1), lambda: (_randn(1024, 2048),))
    add("sum_bf16_inner_1024x1024", lambda x: x.sum(-1), lambda: (_randn(1024, 1024, dtype=torch.bfloat16),))
    add("var_inner_1024x1024", lambda x: x.var(-1), lambda: (_randn(1024, 1024),))
    add("logsumexp_256x4096", lambda x: torch.logsumexp(x, -1), lambda: (_randn(256, 4096),))
    add("max_with_idx_256x4096", lambda x: x.max(-1), lambda: (_randn(256, 4096),))
    # scans, selection, sorting
    add("cumsum_inner_256x1024", lambda x: x.cumsum(-1), lambda: (_randn(256, 1024),))
    add("cumsum_outer_1024x256", lambda x: x.cumsum(0), lambda: (_randn(1024, 256),))
    add("argmax_inner_64x32000", lambda x: x.argmax(-1), lambda: (_randn(64, 32000),))
    add("argmax_outer_1024x512", lambda x: x.argmax(0), lambda: (_randn(1024, 512),))
    add("topk5_64x32000", lambda x: torch.topk(x, 5, -1), lambda: (_randn(64, 32000),))
    add("sort_256x256", lambda x: torch.sort(x, -1), lambda: (_randn(256, 256),))
    # masking, indexing, joining, layout
    add("where_512x1024", lambda x, y: torch.where(x > 0, x, y), lambda: (_randn(512, 1024), _randn(512, 1024, seed=1)))
    add("masked_fill_causal", lambda s, m: s.masked_fill(m, float("-inf")),
        lambda: (_randn(4, 8, 128, 128), torch.ones(128, 128, dtype=torch.bool).triu(1)))
    add("index_select_10000x128", lambda w, i: w.index_select(0, i),
        lambda: (_randn(10000, 128), torch.randint(0, 10000, (512,), generator=_g())))
    add("gather_256x1024", lambda x, i: x.gather(1, i),
        lambda: (_randn(256, 1024), torch.randint(0, 1024, (256, 64), generator=_g())))
    add("embedding_32000x512", lambda i, w: F.embedding(i, w),
        lambda: (torch.randint(0, 32000, (8, 128), generator=_g()), _randn(32000, 512)))
    add("cat3_512x256", lambda a, b, c: torch.cat([a, b, c], -1),
        lambda: (_randn(512, 256), _randn(512, 256, seed=1), _randn(512, 256, seed=2)))
    add("stack4_256x256", lambda a, b, c, d: torch.stack([a, b, c, d]),
        lambda: tuple(_randn(256, 256, seed=s) for s in range(4)))
    add("transpose_contig_1024x1024", lambda x: x.t().contiguous(), lambda: (_randn(1024, 1024),))
    add("permute_heads_8x128x12x64", lambda x: x.permute(0, 2, 1, 3).contiguous(), lambda: (_randn(8, 128, 12, 64),))
    add("add_16", lambda x, y: x + y, lambda: (_randn(16), _randn(16, seed=1)))
    return p


def _sample(fn: Callable, args: tuple, number: int) -> float:
    start = time.thread_time()
    for _ in range(number):
        fn(*args)
    return (time.thread_time() - start) / number


def _number(fn: Callable, args: tuple, min_sample_s: float) -> int:
    number = 1
    while _sample(fn, args, number) * number < min_sample_s and number < 1 << 16:
        number *= 2
    return number


def _close(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        if a.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            return torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2, equal_nan=True)
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list))
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def measure_program(prog: Program, samples: int, min_sample_s: float) -> dict:
    import kiln

    args = prog.make_inputs()
    compiled = KILN.wrap(prog.fn)
    ok = _close(prog.fn(*args), compiled(*args))
    settle_kiln(lambda: compiled(*args))
    steps = {"eager": prog.fn, "kiln": compiled}
    for fn in steps.values():
        for _ in range(3):
            fn(*args)
    numbers = {name: _number(fn, args, min_sample_s) for name, fn in steps.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(samples):
        for name, fn in steps.items():
            times[name].append(_sample(fn, args, numbers[name]))
    eager_s, kiln_s = statistics.median(times["eager"]), statistics.median(times["kiln"])
    kiln.reset()
    return {"name": prog.name, "eager_ms": eager_s * 1e3, "kiln_ms": kiln_s * 1e3,
            "ratio": eager_s / kiln_s, "correct": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run programs whose name contains this")
    parser.add_argument("--samples", type=int, default=11)
    parser.add_argument("--min-sample-ms", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'program':32s} {'eager ms':>10s} {'kiln ms':>10s} {'eager/kiln':>10s}")
    for prog in _programs():
        if args.only and not any(s in prog.name for s in args.only):
            continue
        row = measure_program(prog, args.samples, args.min_sample_ms / 1e3)
        rows.append(row)
        flag = "" if row["correct"] else "  WRONG"
        flag += "  <1" if row["ratio"] < 1.0 else ""
        print(f"{row['name']:32s} {row['eager_ms']:10.4f} {row['kiln_ms']:10.4f} {row['ratio']:10.2f}{flag}", flush=True)
    if rows:
        print(f"geomean eager/kiln {statistics.geometric_mean([r['ratio'] for r in rows]):.3f}; "
              f"under 1.0: {sum(r['ratio'] < 1.0 for r in rows)} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
