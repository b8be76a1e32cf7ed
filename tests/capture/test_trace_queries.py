"""Questions about the process that torch.compile answers while tracing, answered by Kiln too, and
kept right: each answer is either guarded (a check_query guard: asked again before the graph is
reused, so a change recompiles) or assumed fixed for the process as torch.compile assumes
(torch.distributed.is_available, CUDA availability), or followed by the trace itself (autocast).

torch.distributed.is_available/is_initialized, torch._C._get_privateuse1_backend_name,
torch._C._is_any_autocast_enabled, torch.backends.* flags (cuDNN, cuBLAS tf32, fp16 reductions,
mkldnn), torch.fx's is_fx_tracing, autograd engine queries, thread count, deterministic algorithms,
and logging from library code (a break only where torch.compile breaks too).
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist

import kiln
from tests.capture.trace_oracle import check_breaks, check_traced, fresh

X = torch.randn(3)


def _x() -> tuple:
    return fresh(X)()


def distributed_state(x):
    if dist.is_available() and dist.is_initialized():
        return x + dist.get_rank()
    return x - 1


def privateuse1_name(x):
    return x + 1, torch._C._get_privateuse1_backend_name()


def any_autocast(x):
    return x * (2 if torch._C._is_any_autocast_enabled() else 3)


def any_autocast_inside_a_region(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = torch._C._is_any_autocast_enabled()
    return x * (2 if inside else 3), torch._C._is_any_autocast_enabled()


def backend_flags(x):
    return (x + 1, torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)


def cudnn_enabled_branch(x):
    if torch.backends.cudnn.enabled:
        return x + 1
    return x - 1


def fx_tracing(x):
    if torch.fx._symbolic_trace.is_fx_tracing():
        return x
    return x + 1


def graph_task(x):
    return x + 1, torch._C._current_graph_task_id(), torch.autograd._is_checkpoint_valid()


TRACED = [distributed_state, privateuse1_name, any_autocast, any_autocast_inside_a_region, backend_flags,
          cudnn_enabled_branch, fx_tracing, graph_task]


@pytest.mark.parametrize("fn", TRACED, ids=lambda f: f.__name__)
def test_traced_whole_like_torch_compile(fn) -> None:
    check_traced(fn, _x)


def cublas_tf32(x):
    return x + 1, torch.backends.cuda.matmul.allow_tf32, torch.backends.mkldnn.is_available()


def threads_and_determinism(x):
    return x + torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), torch.cuda.is_available()


@pytest.mark.parametrize("fn", [cublas_tf32, threads_and_determinism], ids=lambda f: f.__name__)
def test_traced_whole_where_torch_compile_breaks(fn) -> None:
    check_traced(fn, _x, oracle=False)


def test_a_backend_flag_changed_between_calls_recompiles() -> None:
    kiln.reset()
    compiled = kiln.compile(cudnn_enabled_branch, backend="eager", fullgraph=True)
    x = torch.zeros(1)
    enabled = torch.backends.cudnn.enabled
    assert compiled(x).item() == (1 if enabled else -1)
    compiles = kiln.stats()["compiles"]
    # the flags() manager: torch's own test helpers may have turned plain assignment off
    with torch.backends.cudnn.flags(enabled=not enabled):
        assert compiled(x).item() == (-1 if enabled else 1)
    assert compiled(x).item() == (1 if enabled else -1)
    assert kiln.stats()["compiles"] == compiles + 1, kiln.stats()


def test_a_tf32_setting_changed_between_calls_recompiles() -> None:
    def f(x):
        return x + (1 if torch.backends.cuda.matmul.allow_tf32 else 2)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    kiln.reset()
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        assert compiled(torch.zeros(1)).item() == (1 if before else 2)
        torch.backends.cuda.matmul.allow_tf32 = not before
        assert compiled(torch.zeros(1)).item() == (2 if before else 1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_the_thread_count_is_guarded() -> None:
    def f(x):
        return x + torch.get_num_threads()

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    threads = torch.get_num_threads()
    try:
        assert compiled(torch.zeros(1)).item() == threads
        torch.set_num_threads(1 if threads != 1 else 2)
        assert compiled(torch.zeros(1)).item() == torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)


def test_is_initialized_is_guarded_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = kiln.compile(lambda x: x + (1 if dist.is_initialized() else 0), backend="eager", fullgraph=True)
    assert compiled(torch.zeros(1)).item() == 0
    # a default process group as init_process_group leaves one (only its presence is read)
    monkeypatch.setattr(dist.distributed_c10d._world, "_default_pg", object(), raising=False)
    assert dist.is_initialized()
    assert compiled(torch.zeros(1)).item() == 1


def test_the_guards_name_the_setting() -> None:
    report = kiln.explain(cudnn_enabled_branch)(X)
    assert any("enabled" in str(g) for g in report.guards), [str(g) for g in report.guards]


library_log = logging.getLogger("kiln_test_library")


def _library_helper(x):
    library_log.warning("called with %s", tuple(x.shape))
    return x * 2


def test_logging_from_library_code_breaks_as_in_torch_compile() -> None:
    def f(x):
        return _library_helper(x) + 1

    check_breaks(f, _x, "Logger.warning")


# torch.nn's attention modules ask whether a proxy-tensor trace is running (activation._is_make_fx_tracing,
# which reads the dispatch mode stack) before taking their inference fast path: torch.compile answers
# yes, so the decomposed path is traced in one graph; Kiln broke at torch._C._len_torch_dispatch_stack
torch.manual_seed(0)
_MHA = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
_ENCODER = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
_DECODER = torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()


def mha_inference(x):
    with torch.no_grad():
        return _MHA(x, x, x, need_weights=False)


def mha_inference_with_weights(x):
    with torch.no_grad():
        return _MHA(x, x * 2, x * 2)


def encoder_layer_inference(x):
    with torch.no_grad():
        return _ENCODER(x)


def decoder_layer_inference(x):
    with torch.no_grad():
        return _DECODER(x, x.flip(1))


def _seq() -> tuple:
    return (torch.randn(2, 5, 16),)


@pytest.mark.parametrize("fn", [mha_inference, mha_inference_with_weights,
                                encoder_layer_inference, decoder_layer_inference], ids=lambda f: f.__name__)
def test_attention_modules_trace_their_decomposed_path_like_torch_compile(fn) -> None:
    check_traced(fn, _seq)
