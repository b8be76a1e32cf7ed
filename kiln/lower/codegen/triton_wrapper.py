"""The Python wrapper of a Triton-compiled graph: the C++ path's wrapper with launches for kernels.

It is the same program as codegen/wrapper.py writes (size symbols read off the inputs, buffers
allocated, externs called through ATen, dead buffers freed) with three differences: buffers are
allocated on the graph's device, a kernel is launched as `kernel[grid](tensors..., sizes...,
XBLOCK=...)` with its grid computed from the (symbolic) sizes at call time, and a kernel that
gathers through loaded indices gets a one-element flag it sets for an index out of range, which
the wrapper turns into eager's IndexError (on CUDA with an asynchronous device assert, so
nothing waits for the GPU). Corresponds to the Triton launches of torch/_inductor/codegen/wrapper.py.
"""
from __future__ import annotations

import dataclasses

from types import ModuleType
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from kiln.lower.codegen import wrapper as cpp_wrapper
from kiln.lower.codegen.triton_kernel import Launch
from kiln.lower.ir import Layout
from kiln.lower.schedule import Kernel, KernelProgram, ScatterKernel


def _raise_on_flag(flag: torch.Tensor, where: str) -> None:
    """After a gathering kernel: raise as eager does when an index was out of range."""
    if flag.device.type == "cuda":
        # eager's CUDA kernels assert on the device too: the error surfaces at the next sync
        torch._assert_async(flag[0] == 0, f"index out of range in {where}")
    elif int(flag[0]):
        raise IndexError(f"index out of range in self (a gather in {where})")


def _raise_kernel_error(err: torch.Tensor, where: str) -> None:
    """After a kernel with checks: raise what eager raises for the failure it recorded, if any."""
    from kiln.lower.codegen.triton import ZERO_DIVISION_SITE

    if err.device.type == "cuda":
        # eager's CUDA indexing asserts on the device, and its integer division by zero does not raise
        torch._assert_async(err[0] <= ZERO_DIVISION_SITE, f"index out of range in {where}")
        return
    site, value, size = (int(v) for v in err.tolist())
    if site == 0:
        return
    if site == ZERO_DIVISION_SITE:
        raise RuntimeError("ZeroDivisionError")
    from kiln.lower.checks import describe_site  # the sites exist only where the checks module does

    error, message = describe_site(site)
    raise error(message.format(value=value, size=size))


class TritonWrapperWriter(cpp_wrapper.WrapperWriter):
    """Writes the wrapper of a program whose kernels are the Triton functions of `launches`."""

    extern_outs = False  # matmuls return their own result on the device (no memory plan there yet)

    def __init__(self, program: KernelProgram, launches: dict[str, Launch], device: torch.device,
                 autotune: bool = False) -> None:
        super().__init__(program, {})
        self.launches = launches
        self.autotune = autotune  # kernels are AutotunedKernel objects, called with their range size
        self.globals["device"] = device
        self.globals["_raise_on_flag"] = _raise_on_flag
        self.globals["_raise_kernel_error"] = _raise_kernel_error

    def kernel_buffers(self, step: Kernel) -> list[str]:
        return list(self.launches[step.name].buffers)

    def memory_facts(self, last_use: dict[str, int], outputs: set[str]) -> cpp_wrapper.MemoryFacts:
        """No memory plan on the device yet: every buffer is allocated fresh (`_alloc` below), so the
        plan is given nothing to share (and keeps nothing alive for sharing)."""
        facts = super().memory_facts(last_use, outputs)
        return dataclasses.replace(facts, allocations=(), results=())

    def _alloc(self, name: str, layout: Layout) -> None:
        self.layouts[name] = layout
        self.lines.append(f"    {name} = torch.empty_strided({cpp_wrapper._tuple(layout.sizes)}, "
                          f"{cpp_wrapper._tuple(layout.strides)}, dtype={self.arg(layout.dtype)}, device=device)")

    def _kernel(self, step: Kernel | ScatterKernel) -> None:
        launch = self.launches[step.name]
        nodes = step.nodes if isinstance(step, Kernel) else ()
        for n in nodes:
            if n.name in launch.buffers and n.name not in self.layouts:
                self._alloc(n.name, n.layout)
        args = list(launch.buffers) + list(launch.symbols) + (["seed"] if launch.seed else [])
        if launch.index_check:
            self.lines.append("    index_error = torch.zeros((1,), dtype=torch.int32, device=device)")
            args.append("index_error")
        if launch.error_sites:
            self.lines.append("    kiln_err = torch.zeros((3,), dtype=torch.int64, device=device)")
            args.append("kiln_err")
        args.append(f"XBLOCK={launch.xblock}")
        if launch.rblock is not None:
            args.append(f"RBLOCK={launch.rblock}")
        xnumel = cpp_wrapper.pyexpr(launch.xnumel)
        if launch.serial:
            grid = "1"
        elif launch.xnumel.is_number:
            grid = str(-(-int(launch.xnumel) // launch.xblock))
        else:
            grid = f"-(-{xnumel} // {launch.xblock})"
        origins = ", ".join(launch.origins)
        if launch.xnumel.is_number and int(launch.xnumel) == 0:
            self.lines.append(f"    # {step.name} has nothing to do (an empty range)  # {origins}")
            return
        if self.autotune:
            call = f"{step.name}.launch({xnumel}, {', '.join(a for a in args if '=' not in a)})"
        else:
            call = f"{step.name}[({grid},)]({', '.join(args)})"
        if launch.xnumel.is_number:
            self.lines.append(f"    {call}  # {origins}")
        else:  # a symbolic range may be empty at run time: a grid of zero programs is not launched
            self.lines.append(f"    if {xnumel} > 0: {call}  # {origins}")
        if launch.index_check:
            self.lines.append(f"    _raise_on_flag(index_error, {step.name!r} + ' ({origins})')")
        if launch.error_sites:
            self.lines.append(f"    _raise_kernel_error(kiln_err, {step.name!r} + ' ({origins})')")


def make_triton_wrapper(program: KernelProgram, launches: dict[str, Launch], module: ModuleType,
                        device: torch.device, *, autotune: bool = False,
                        kernel_source: str = "") -> tuple[Callable[..., Any], str]:
    """The wrapper function bound to the module's kernels, and its source; with `autotune`, each
    kernel picks its launch configuration on first call (kiln.runtime.autotune)."""
    w = TritonWrapperWriter(program, launches, device, autotune)
    source = w.write()
    env = dict(w.globals)
    cpp_wrapper.bind_overloads(env)
    for name, launch in launches.items():
        env[name] = getattr(module, name)
        if autotune:
            from kiln.runtime.autotune import AutotunedKernel, KernelShape

            shape = KernelShape(launch.kind, launch.xblock, launch.rblock)
            env[name] = AutotunedKernel(env[name], name, kernel_source, shape, rerunnable=launch.kind != "atomic")
    exec(compile(source, "<kiln triton wrapper>", "exec"), env)
    takes_list = env["call"]  # the generated `call(args)` empties the list it is given

    def call(*args: Any) -> Any:
        return takes_list(list(args))
    if device.type == "cuda":
        on_device = call

        def call(*args: Any) -> Any:  # CPU tensors (0-d scalars) move to the GPU the kernels read from
            return on_device(*[a.to(device) if isinstance(a, torch.Tensor) and a.device != device else a
                               for a in args])
    if program.ir.output_spec is None:
        return call, source
    spec = pytree.treespec_loads(program.ir.output_spec)  # nested outputs: the structure the graph returns

    def nested(*args: Any) -> Any:
        return pytree.tree_unflatten(list(call(*args)), spec)

    return nested, source


def graph_device(example_inputs: Any) -> torch.device:
    """The device of a graph's tensors: CUDA when any input is on CUDA (a 0-d CPU tensor may come
    along, as eager allows), else its first tensor input's; CPU for a graph without one."""
    devices = [torch.device(x.device) for x in example_inputs if isinstance(x, torch.Tensor)]
    return next((d for d in devices if d.type == "cuda"), devices[0] if devices else torch.device("cpu"))


def choose_codegen(device: torch.device, cpu_backend: str) -> str:
    """"triton" for CUDA tensors, else the configured CPU code generator ("cpp" or "triton")."""
    if cpu_backend not in ("cpp", "triton"):
        raise ValueError(f"kiln.config.cpu_backend (KILN_CPU_BACKEND) must be 'cpp' or 'triton', not {cpu_backend!r}")
    if device.type == "cuda":
        return "triton"
    return cpu_backend if device.type == "cpu" else "cpp"


def compile_program(program: KernelProgram, device: torch.device, *,
                    autotune: bool = False) -> tuple[Callable[..., Any], str, str]:
    """Generate, load and wrap the Triton kernels of a program: (wrapper function, kernel source,
    wrapper source). CPU tensors run under Triton's interpreter (where timing means nothing, so
    `autotune`, asked for by mode="max-autotune", applies on CUDA only)."""
    from kiln.lower.codegen.triton_kernel import generate
    from kiln.runtime import triton_build

    if not triton_build.available():
        raise RuntimeError("kiln: the Triton code generator needs the 'triton' package (pip install triton==3.9.0)")
    source, launches = generate(program)
    module = triton_build.load(source, interpret=device.type != "cuda")
    fn, wrapper_source = make_triton_wrapper(program, launches, module, device,
                                             autotune=autotune and device.type == "cuda", kernel_source=source)
    return fn, source, wrapper_source
