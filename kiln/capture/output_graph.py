"""The FX graph under construction: placeholders for inputs, one node per traced op.

The tracer asks this object to turn sources into graph inputs (a placeholder whose
`meta["example_value"]` is the input's fake, plus one placeholder per new size symbol) and to
record ops (`call`, which runs the op on the fakes to learn its output and adds the node). At a
graph break or return, `compile` closes the graph over the values the glue needs and hands it to
the backend. Corresponds to torch/_dynamo/output_graph.py.
"""
from __future__ import annotations

import inspect
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch.utils import _pytree as pytree

from kiln.capture import distributed
from kiln.capture.aliased_reads import aliased_read
from kiln.capture.guards import Guard, tensor_guard, user_name
from kiln.capture.process_modes import MODE_WRITERS
from kiln.capture.sources import Source
from kiln.capture.value_only_floats import value_only_floats_as_hints
from kiln.capture.verify import verify_captured_graph
from kiln.errors import HookedTensorEscapes, InferenceModeEscapes, KilnError, Unsupported
from kiln.fake.composites import python_dispatcher
from kiln.fake.value_checks import raises_on_values
from kiln.runtime.overlap import may_overlap_guarded
from kiln.symbolic import marked_dynamic, marked_range

# Tensor types capture makes fake and traces (anything else: a subclass, which breaks)
_FAKEABLE_TYPES = (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer)

if TYPE_CHECKING:
    from kiln.capture.variables.base import Variable


def _plain_parameter_subclass(kind: type) -> bool:
    """A subclass of nn.Parameter that computes as one: Parameter's torch-function and dispatch
    handlers are the disabled ones, so its ops are plain tensor ops; a subclass overriding either
    changes what each op does, which a graph of plain ops would drop."""
    return issubclass(kind, torch.nn.Parameter) \
        and kind.__torch_function__ is torch._C._disabled_torch_function_impl \
        and kind.__torch_dispatch__ is torch.Tensor.__torch_dispatch__

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)

# FX prints a complex constant by its repr, `(inf-infj)`, and binds `inf` and `nan` in the code it
# generates but not `infj`/`nanj`: a graph filling with complex(inf, -inf) raised NameError when its
# code ran (an internal error, the frame ran eagerly). Bound as FX binds `inf`: `inf - infj` reads
# back as complex(inf, -inf), `nan + nanj` as complex(nan, nan).
for _name, _value in (("infj", complex(0.0, math.inf)), ("nanj", complex(0.0, math.nan))):
    torch.fx.graph._register_custom_builtin(_name, f"{_name} = complex(0.0, float({_name[:-1]!r}))", _value)


def _symbolic(args: tuple, kwargs: dict) -> bool:
    """Whether an op's arguments hold a symbolic number or a tensor with symbolic sizes (one level
    of lists and tuples deep, as op arguments are)."""
    for group in (args, kwargs.values()):
        for a in group:
            for b in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(b, _SYM_TYPES) or isinstance(b, torch.Tensor) and b._has_symbolic_sizes_strides:
                    return True
    return False


@dataclass(frozen=True)
class GraphInput:
    """One placeholder: the expression the glue evaluates to feed it, and its example value."""

    node_name: str
    source: str
    example: Any


@dataclass(frozen=True)
class CompiledGraph:
    """A closed graph: the GraphModule, its compiled callable, the input expressions, and outputs."""

    gm: torch.fx.GraphModule
    fn: Callable[..., Any]
    inputs: tuple[str, ...]
    n_outputs: int


class OutputGraph:
    """The graph of one capture, plus the fake mode and shape environment its values live in."""

    def __init__(self, fake_mode: Any, shape_env: Any, policy: Any, dynamic: bool | None) -> None:
        self.graph = torch.fx.Graph()
        self.fake_mode = fake_mode
        self.shape_env = shape_env
        self.policy = policy
        self.dynamic = dynamic
        self.inputs: list[GraphInput] = []
        self.guards: list[Guard] = []
        # an input is an inference tensor (made under inference_mode): what the graph computes from it may be one too
        self.inference_inputs = False
        # `with torch.inference_mode():` blocks open in the trace, and the fakes made in them (or views
        # of those): eager's inference tensors, which must not be seen where they differ (follow_inference)
        self.inference_depth = 0
        self.hooked: set[torch.fx.Node] = set()  # computed tensors a node of the graph registers a hook on
        # (cell, tensor, version) for each closure cell of such a hook that held a tensor: the graph
        # hands the hook that tensor, so the cell must not be rebound nor the tensor written later
        self.hook_cells: list[tuple[Any, Any, int]] = []
        # id(fake) -> the TensorVariable of the input it stands for: what an in-place op on an input
        # returns (`p -= lr * p.grad` rebinds p to it) is the same tensor, with the same .grad
        self.input_tensors: dict[int, Any] = {}
        self.inference_made: dict[int, torch.Tensor] = {}
        self._inference_input_storages: set[int] = set()
        # instance-dict source -> names the trace found elsewhere (see note_absent)
        self._absent: dict[str, set[str]] = {}
        self._input_vars: dict[str, "Variable"] = {}
        self._symbol_nodes: dict[Any, torch.fx.Node] = {}
        self._last_placeholder: torch.fx.Node | None = None
        self._non_leaf_fakes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(leaf fake) -> both
        self._shared_storages: tuple[int, set[int]] = (0, set())  # (inputs seen, their storages)
        # the branches of graph-level conds, read by get_attr nodes (kiln/capture/variables/cond_graph.py)
        self.subgraphs: dict[str, torch.fx.GraphModule] = {}
        # A tensor op was traced, even if nothing used it (`{a: x, b: x * 2}[a]`): the frame is
        # captured again for other inputs, not left eager for good (entry.py)
        self.traced_tensor_ops = False
        # the device of the DeviceContext the frame was called under (kiln.capture.device_context):
        # written into the graph's factories; the graph then runs with the modes off the stack
        self.default_device: torch.device | None = None
        # conditions the glue checks after the graph (kiln.capture.deferred_checks), and whether an
        # op writes into an input's storage (then none may be deferred)
        self.deferred_checks: list[torch.fx.Node] = []
        self.writes_inputs = False
        # whether an op was traced inside a try or with block of the traced frames: an error the
        # graph raises at run time must reach the program's handler (deferred_checks.emit_checks)
        self.ops_under_handler = False
        # divisors of Python numbers in the graph that are symbolic (a `//`, `%` or `/` by an int or
        # float argument): the glue tests them before the call (kiln.capture.deferred_checks)
        self.divisors: list[Any] = []
        # the fake mode's count of ops that draw from a generator when the last node was made: a node
        # made after fake runs that drew (an op's own, or a vmap or torch.func body's) is DRAWS_RANDOM
        self._draws_seen = getattr(fake_mode, "seeded_calls", 0)

    # ------------------------------------------------------------------------------ inputs
    def _placeholder(self, name: str, source: str, example: Any) -> torch.fx.Node:
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first) if first is not None else self.graph.inserting_after(None)
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        # the argument names of the graph's code: sources that differ only in case (`w`, `W`) or in
        # punctuation name the same placeholder, which FX would write twice into one signature
        taken = {n.target for n in self.graph.find_nodes(op="placeholder")}
        unique, k = name, 1
        while unique in taken:
            unique, k = f"{name}_{k}", k + 1
        with ctx:
            node = self.graph.placeholder(unique)
        node.meta["example_value"] = example
        node.meta["source"] = source
        if isinstance(example, torch.Tensor) and example.layout == torch.strided:
            # the fake's layout on entry: an in-place op of the frame (t_, unsqueeze_) changes it
            node.meta["entry_layout"] = (tuple(example.shape), tuple(example.stride()), example.storage_offset())
            node.meta["entry_requires_grad"] = example.requires_grad
        self._last_placeholder = node
        self.inputs.append(GraphInput(node.name, source, example))
        return node

    def guard_storage_offsets(self, example: torch.Tensor) -> None:
        """The trace read where a tensor starts in its storage (storage_offset(), as_strided with
        an offset): guard the offset of each graph input sharing that storage. The guard is not
        added otherwise, so slices of one buffer at other offsets reuse the graph."""
        if example.layout != torch.strided or not torch._C._has_storage(example):
            return
        storage = torch._C._storage_id(example)  # type: ignore[attr-defined]  # bound in C++, not in the stubs
        for graph_input in self.inputs:
            value = graph_input.example
            if (isinstance(value, torch.Tensor) and value.layout == torch.strided and torch._C._has_storage(value)
                    and torch._C._storage_id(value) == storage):  # type: ignore[attr-defined]
                self.guards.append(Guard(f"{graph_input.source}.storage_offset()", "check_value",
                                         int(value.storage_offset())))

    def note_absent(self, instance_dict: Source, name: str) -> None:
        """The trace found `name` on an object's class (or a module's tables), so the object's
        instance dict at `instance_dict` must not hold it: one check_absent guard per object,
        over every such name (absent_guards)."""
        self._absent.setdefault(instance_dict.name(), set()).add(name)

    def absent_guards(self) -> list[Guard]:
        return [Guard(source, "check_absent", frozenset(names)) for source, names in self._absent.items()]

    def tensor_input(self, value: torch.Tensor, source: Source) -> tuple[torch.fx.Node, torch.Tensor]:
        """A placeholder for the real tensor at `source` (guarded on its metadata)."""
        name = source.name()
        # Refused before its sizes are read: a nested tensor has none (or nested ints) to read.
        if type(value) not in _FAKEABLE_TYPES and not _plain_parameter_subclass(type(value)) \
                or value.is_quantized or value.is_nested:
            what = f"a tensor of the subclass {type(value).__qualname__}" if type(value) not in _FAKEABLE_TYPES \
                else "a quantized or nested tensor"
            raise Unsupported(f"{what} at {user_name(name)}: capture traces plain tensors", kind="tensor_subclass")
        dims: tuple[int, ...] = ()
        if self.policy is not None and self.shape_env is not None and value.dim() > 0:
            dims = tuple(self.policy.dynamic_dims(name, value, self.dynamic))
        if dims:
            # mark_dynamic is a promise: the ShapeEnv raises ConstraintViolation, naming the user's
            # line, if the program specializes one of these dims (docs/seams.md, ShapeEnv.constrain).
            for d in sorted(marked_dynamic(value)):
                if d in dims:
                    self.shape_env.constrain(f"{name}.size()[{d}]", bounds=marked_range(value, d))
            # Meta tensors with symbolic sizes need the Python dispatcher: some meta kernels are Python refs.
            with enable_python_dispatcher():
                fake = self.fake_mode.from_real(value, source=name, dynamic_dims=dims)
        else:
            fake = self.fake_mode.from_real(value, source=name)
        for d, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt):
                self.symbol_input(size, f"{name}.size()[{d}]")
        if value.requires_grad and not value.is_leaf:
            fake = self._non_leaf(fake, value)
        node = self._placeholder(_node_name(name), name, fake)
        self.guards.append(tensor_guard(name, value, dims))
        node.meta["inference"] = value.is_inference()  # the guard checks it; the fake cannot say
        self.inference_inputs = self.inference_inputs or value.is_inference()
        if value.is_inference():
            self._inference_input_storages.add(_storage_id(fake))
        if fake.requires_grad and not fake.is_leaf:
            # The graph may do in-place ops that autograd forbids on a leaf: it holds for non-leaves only.
            self.guards.append(Guard(f"{name}.is_leaf", "check_value", False))
        return node, fake

    def _non_leaf(self, fake: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """A non-leaf fake for a real tensor with a grad_fn (from_real makes leaves).

        A leaf that requires grad rejects in-place ops (`F.relu(h, inplace=True)` on an activation
        passed to a resume function), which eager allows on the real non-leaf. A clone under grad
        is a non-leaf with the same sizes and strides when the tensor is dense; views and other
        layouts keep the leaf fake (their aliasing with other inputs matters more).
        """
        if value._base is not None:
            return fake
        cached = self._non_leaf_fakes.get(id(fake))
        if cached is not None:
            return cached[1]
        with self.fake_mode, torch.enable_grad():
            copy = fake.clone(memory_format=torch.preserve_format)
        if copy.stride() != fake.stride():
            return fake
        self._non_leaf_fakes[id(fake)] = (fake, copy)
        return copy

    def symbol_input(self, size: torch.SymInt | torch.SymFloat, source: str) -> torch.fx.Node | None:
        """A placeholder for a new size symbol or symbolic float argument (graphs take them as inputs)."""
        from kiln.symbolic import expr_of

        expr = expr_of(size)
        if not getattr(expr, "is_Symbol", False) or expr in self._symbol_nodes:
            return self._symbol_nodes.get(expr)
        node = self._placeholder(str(expr), source, size)
        self._symbol_nodes[expr] = node
        return node

    def node_for_symint(self, value: Any) -> torch.fx.Node | None:
        """The placeholder of a plain size symbol, if `value` is one."""
        if not isinstance(value, _SYM_TYPES):
            return None
        from kiln.symbolic import expr_of

        return self._symbol_nodes.get(expr_of(value))

    # ------------------------------------------------------------------------------ ops
    def create_node(self, kind: str, target: Any, args: tuple, kwargs: dict, example: Any) -> torch.fx.Node:
        node = self.graph.create_node(kind, target, args, kwargs)
        node.meta["example_value"] = example
        draws = getattr(self.fake_mode, "seeded_calls", 0)
        if draws != self._draws_seen:  # its fake run drew: eager advances a generator here
            node.meta[DRAWS_RANDOM] = True
            self._draws_seen = draws
        return node

    def run_fake(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        """Run one op on example values under the fake mode; failures become Unsupported."""
        written = written_tensors(kind, target, args, kwargs)
        if written:
            self._note_input_writes(written)
            self._refuse_inference_input_writes(target, written)
            self._refuse_shared_memory_writes(kind, target, written, args, kwargs)
            self._refuse_partially_overlapping_reads(kind, target, written, args, kwargs)
        if kind == "call_function":
            args, kwargs = value_only_floats_as_hints(target, args, kwargs)
        try:
            if self.shape_env is not None and _symbolic(args, kwargs):
                # A composite op's C++ decomposition takes concrete sizes only (interpolate's
                # upsample with a size computed from a symbolic size and a float scale factor);
                # under the Python dispatcher it decomposes in Python, over symbols.
                with self.fake_mode, python_dispatcher():
                    if kind == "call_method":
                        return getattr(args[0], target)(*args[1:], **kwargs)
                    return target(*args, **kwargs)
            with self.fake_mode:
                if kind == "call_method":
                    return getattr(args[0], target)(*args[1:], **kwargs)
                return target(*args, **kwargs)
        except KilnError:
            raise  # Unsupported breaks; ConstraintViolation (mark_dynamic) reaches the user as it is
        except Exception as exc:
            name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
            text = str(exc)
            kind_ = "unsupported_call"
            if "fake impl" in text:
                kind_ = "missing_fake_impl"
            elif "data-dependent" in text or "data dependent" in text:
                kind_ = "data_dependent"
            elif "symbolic" in text.lower():
                kind_ = "dynamic_shape"
            first = text.splitlines()[0] if text else ""
            raise Unsupported(f"{name} failed on fake inputs: {type(exc).__name__}: {first}",
                              kind=kind_) from exc

    def _refuse_shared_memory_writes(self, kind: str, target: Any, written: list[torch.Tensor], args: tuple,
                                     kwargs: dict) -> None:
        """A write into a tensor whose elements share memory (an expand), or into the memory of a
        graph input that does, is a graph break: the op runs eagerly, with eager's result or error.

        Eager writes each shared address in turn (fill_, zero_, masked_fill_ and index writes of one
        value succeed; add_, copy_ of a tensor ... raise), and later reads of any alias see it. A
        functional graph cannot say that: it computes the new value of each element apart, writes
        it back with one copy (which ATen refuses into such memory), and folds a write through an
        expand back into its base by summing over the expanded dim."""
        shared = self._shared_input_storages()
        for t in written:
            if may_overlap_guarded(tuple(t.shape), t.stride()) or _storage_id(t) in shared:
                name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
                raise Unsupported(f"{name} writes into a tensor whose elements share memory (sizes "
                                  f"{list(t.shape)}, strides {list(t.stride())}, or a view of such an input)",
                                  kind="overlapping_write", eager_error=self._eager_refusal(kind, target, args, kwargs))

    def _note_input_writes(self, written: list[torch.Tensor]) -> None:
        if not self.writes_inputs:
            inputs = {_storage_id(i.example) for i in self.inputs
                      if isinstance(i.example, torch.Tensor) and i.example.layout == torch.strided}
            self.writes_inputs = any(t.layout != torch.strided or _storage_id(t) in inputs for t in written)

    def _refuse_inference_input_writes(self, target: Any, written: list[torch.Tensor]) -> None:
        """An in-place write into an inference tensor passed in (or a view of one), outside inference
        mode, is a break: eager refuses it, and a compiled graph would write its storage quietly."""
        if not self._inference_input_storages or self.inference_depth or torch.is_inference_mode_enabled():
            return
        if any(_storage_id(t) in self._inference_input_storages for t in written):
            name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
            raise Unsupported(f"{name} writes in place into an inference tensor outside inference_mode "
                              f"(raised natively)", kind="unsupported_call")

    def _eager_refusal(self, kind: str, target: Any, args: tuple, kwargs: dict) -> BaseException | None:
        """The error eager raises for this write, or None: the op run on small real CPU tensors of
        the arguments' layouts (zeros; arguments that share a storage share one here too). ATen's
        check that no two written elements share an address runs in its CPU kernels, not in the meta
        ones: add_ and copy_ refuse, fill_ writes each address in turn. Not tried where a size is
        symbolic or a storage is large (the answer stays a break)."""
        storages: dict[int, torch.Tensor] = {}

        def real(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            sizes, strides, offset = tuple(v.shape), v.stride(), v.storage_offset()
            if not all(type(n) is int for n in (*sizes, *strides, offset)):
                raise _NoProbe
            numel = v.untyped_storage().nbytes() // max(v.element_size(), 1)
            if numel > _PROBE_ELEMENTS:
                raise _NoProbe
            key = _storage_id(v)
            if key not in storages:
                storages[key] = torch.zeros(numel, dtype=v.dtype)
            return storages[key].as_strided(sizes, strides, offset)

        rng = torch.get_rng_state()  # a random in-place op (bernoulli_) draws here too: put the stream back
        try:
            # outside the fake mode (entered only around each fake run): these are real tensors
            real_args = tuple(pytree.tree_map(real, list(args)))
            real_kwargs = pytree.tree_map(real, dict(kwargs))
            if kind == "call_method":
                getattr(real_args[0], target)(*real_args[1:], **real_kwargs)
            else:
                target(*real_args, **real_kwargs)
        except _NoProbe:
            return None
        except RuntimeError as exc:
            return exc if "memory location" in str(exc) else None
        except Exception:  # anything else is not an answer eager gives for sure
            return None
        finally:
            torch.set_rng_state(rng)
        return None

    def _refuse_partially_overlapping_reads(self, kind: str, target: Any, written: list[torch.Tensor],
                                            args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """An op that reads memory it writes through another tensor (`x[:-1].add_(x[1:])`,
        `m.add_(m.t())`, `x.mul_(x[:, :1])`, `x.scatter_(0, i, x)`) is a graph break: eager refuses
        it with an error, or gives the result of its own order of reads and writes, while the
        functional graph reads every element before writing any (kiln.capture.aliased_reads)."""
        tensors = _tensor_arguments(args, kwargs)
        if not any(r.layout == torch.strided and w.layout == torch.strided and _storage_id(r) == _storage_id(w)
                   and (r is not w or sum(t is w for t in tensors) > 1) for r in tensors for w in written):
            # nothing read shares memory with what is written: no overlap, whatever the index; the
            # view x[i] is not made (C++ indexing reads a symbolic i's value: a guard i == 2, and
            # a recompile for every new index)
            return
        destinations = written
        if target is operator.setitem and len(args) == 3 and _basic_index(args[1]):
            with self.fake_mode:  # `x[i] = v` writes the view x[i] (a copy_), not all of x
                destinations = [_basic_view(args[0], args[1])]
        found = aliased_read(kind, target, destinations, written, args, kwargs)
        if found is not None:
            read, dest = found
            name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
            raise Unsupported(f"{name} reads memory it writes, at other places or in its own order (sizes "
                              f"{list(read.shape)} and {list(dest.shape)} in one storage)", kind="partial_overlap")

    def shares_input_storage(self, t: torch.Tensor) -> bool:
        """Whether t is a graph input or shares the storage of one (a view of it, its .data)."""
        return any(isinstance(i.example, torch.Tensor) and i.example.layout == torch.strided
                   and _storage_id(i.example) == _storage_id(t) for i in self.inputs)

    def _shared_input_storages(self) -> set[int]:
        """The storages of graph inputs with elements that share memory (the inputs only grow)."""
        if self._shared_storages[0] != len(self.inputs):
            self._shared_storages = (len(self.inputs), {
                _storage_id(i.example) for i in self.inputs
                if isinstance(i.example, torch.Tensor) and i.example.layout == torch.strided
                and may_overlap_guarded(tuple(i.example.shape), i.example.stride())})
        return self._shared_storages[1]

    # ------------------------------------------------------------------------------ closing
    def has_ops(self) -> bool:
        """Whether the graph computes anything (grad-mode switches alone do not count)."""
        return any(n.op in ("call_function", "call_method", "call_module")
                   and n.target not in _MODE_SWITCHES for n in self.graph.nodes)

    def follow_inference(self, kind: str, target: Any, args: tuple, kwargs: dict, result: Any) -> None:
        """Track the tensors eager makes as inference tensors: every result inside an inference-mode
        block, and views of them after it. After the block, an in-place write into one (eager raises)
        or an op that records autograd over one (eager refuses to save it) restarts the capture with
        the block as a break (InferenceModeEscapes)."""
        results = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        if self.inference_depth:
            self.inference_made.update((id(t), t) for t in results)
            return
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        made = [t for t in inputs if self.inference_made.get(id(t)) is t]
        if not made:
            return
        if any(self.inference_made.get(id(t)) is t for t in written_tensors(kind, target, args, kwargs)):
            raise InferenceModeEscapes(f"{target} writes in place into a tensor made under inference_mode")
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            raise InferenceModeEscapes(f"{target} records autograd over a tensor made under inference_mode")
        storages = {_storage_id(t) for t in made}
        self.inference_made.update((id(t), t) for t in results if _storage_id(t) in storages)  # views stay inference

    def made_in_inference(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and self.inference_made.get(id(t)) is t

    def close(self, outputs: Sequence[torch.fx.Node]) -> None:
        """Add the output node (a tuple of `outputs`) and drop the ops nothing needs."""
        if any(self.made_in_inference(n.meta.get("example_value")) for n in outputs):
            raise InferenceModeEscapes("a tensor made under inference_mode leaves the graph")
        if self.hooked.intersection(outputs):
            raise HookedTensorEscapes("a tensor with a hook registered in the graph leaves the graph")
        if any(cell.contents is not t or t.example._version != version for cell, t, version in self.hook_cells):
            raise HookedTensorEscapes("a tensor a hook registered in the graph reads is rebound or written later")
        self.traced_tensor_ops = self.traced_tensor_ops or any(
            n.op.startswith("call_") and isinstance(n.meta.get("example_value"), torch.Tensor) for n in self.graph.nodes)
        self.graph.output(tuple(outputs))
        _eliminate_dead_code(self.graph)

    def compile(self, compiler: Callable[..., Any] | None, name: str) -> CompiledGraph:
        """Hand the closed graph to the backend; returns it with the expressions of its inputs."""
        root = torch.nn.Module()
        for attr, subgraph in self.subgraphs.items():
            setattr(root, attr, subgraph)
        gm = torch.fx.GraphModule(root, self.graph, class_name=name)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        by_name = {i.node_name: i for i in self.inputs}
        inputs = tuple(by_name[p.name].source for p in placeholders)
        for p in placeholders:
            p.meta["example_value"] = _as_on_entry(p)
        examples = [p.meta["example_value"] for p in placeholders]
        verify_captured_graph(gm)
        ddp_module = distributed.active_ddp_module() if compiler is not None else None
        if ddp_module is not None and compiler is not None:  # traced inside DDP's forward: one piece per bucket
            fn = distributed.compile_split(gm, examples, compiler, ddp_module)
        else:
            fn = gm if compiler is None else compiler(gm, examples)
        n_outputs = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        return CompiledGraph(gm, fn, inputs, n_outputs)


def _as_on_entry(placeholder: torch.fx.Node) -> Any:
    """The placeholder's example as the frame received it: a fake whose sizes or strides an
    in-place op of the frame changed (x.t_()) is handed to the backend as a view of itself with
    its layout on entry, so the backend traces the in-place op from the input's real layout."""
    example = placeholder.meta["example_value"]
    layout = placeholder.meta.get("entry_layout")
    if layout is None:
        return example
    if example.requires_grad and placeholder.meta.get("entry_requires_grad") is False:
        # an in-place op with an operand that requires grad (`x[1:].add_(w)`) gave the fake
        # history: the backend gets it as it came in (an alias without grad), or its trace sees a
        # leaf that requires grad updated in place, which autograd refuses
        example = example.detach()
    now = (*example.shape, *example.stride(), example.storage_offset())
    entry = (*layout[0], *layout[1], layout[2])
    if len(now) == len(entry) and all(map(_same_size, now, entry)):
        return example
    with torch.no_grad():
        return example.as_strided(*layout)


def _same_size(a: Any, b: Any) -> bool:
    # by expression: comparing SymInts with == would add a guard
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) and a.node.expr == b.node.expr
    return bool(a == b)


# Nodes that switch a mode (grad, autocast) compute nothing by themselves.
_MODE_SWITCHES = (torch._C._set_grad_enabled, torch.amp._enter_autocast, torch.amp._exit_autocast, *MODE_WRITERS)
_IMPURE = {torch._C._set_grad_enabled, operator.setitem, torch.amp._exit_autocast, *MODE_WRITERS}
# The meta key of a node whose fake run drew from a generator (an op with the nondeterministic_seeded
# tag ran: torch.rand, dropout in train mode, rrelu, multinomial): eager advances the generator for
# it whether or not its result is read, so it is never dead code.
DRAWS_RANDOM = "kiln_draws_random"


def _eliminate_dead_code(graph: torch.fx.Graph) -> None:
    # In-place methods (names ending in "_"), setitem and calls with out= mutate their inputs:
    # they stay even when nothing reads their result, and so do ops that check their inputs' values
    # (an index's bounds, an integer divisor: eager raises even when the result is unused) and ops
    # that draw from a generator (DRAWS_RANDOM); unused placeholders go so the glue reads fewer sources.
    for node in reversed(list(graph.nodes)):
        if node.op in ("output", "placeholder") or node.users or raises_on_values(node) or node.meta.get(DRAWS_RANDOM):
            continue
        if node.op == "call_method" and (node.target.endswith("_") and not node.target.startswith("__")
                                         or node.target in ("__setitem__",) or node.target in _INPLACE_DUNDERS):
            continue
        if node.op == "call_function" and (node.target in _IMPURE or getattr(node.target, "kiln_side_effect", False)
                                           or _is_inplace_function(node.target)
                                           or _inplace_flag_set(node) or node.kwargs.get("out") is not None):
            continue
        graph.erase_node(node)


def _inplace_flag_set(node: torch.fx.Node) -> bool:
    """`F.relu(x, inplace=True)` and the other functionals with an `inplace` parameter."""
    return _inplace_argument(node.target, node.args, node.kwargs)


def _inplace_argument(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    if kwargs.get("inplace") is True:
        return True
    if isinstance(target, str):  # a method or attribute name: no signature to read
        return False
    try:
        params = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return False
    if "inplace" not in params:
        return False
    index = params.index("inplace")
    return index < len(args) and args[index] is True


# In-place methods that change a tensor's metadata or autograd state, not its elements.
_METADATA_METHODS = frozenset({"requires_grad_", "retain_grad", "share_memory_", "resize_", "resize_as_", "set_",
                               "as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_",
                               "swapaxes_", "detach_", "rename_", "refine_names_"})


def written_tensors(kind: str, target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a call writes elements of, from its example arguments: `self` of an in-place
    method or function (`add_`, `torch.relu_`, `operator.iadd`, setitem, `inplace=True`) and the
    `out=` tensors."""
    out = kwargs.get("out")
    written = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
    if kind == "call_method":
        in_place = isinstance(target, str) and (target.endswith("_") and not target.startswith("__")
                                                and target not in _METADATA_METHODS or target in _INPLACE_DUNDERS)
    else:
        in_place = (target is operator.setitem or _is_inplace_function(target)
                    or _inplace_argument(target, args, kwargs))
    if in_place and args and isinstance(args[0], torch.Tensor):
        written.append(args[0])
    elif in_place and args and isinstance(args[0], (list, tuple)):
        # the foreach and fused optimizer ops write every tensor of their mutable list arguments
        for index in _written_list_arguments(target):
            if index < len(args) and isinstance(args[index], (list, tuple)):
                written += [t for t in args[index] if isinstance(t, torch.Tensor)]
    return written


def _written_list_arguments(target: Any) -> list[int]:
    """The positions of the arguments that `torch._foreach_add_` and its kind write (their aten
    schemas mark them), over every overload of the op of that name; [0] when there is none."""
    name = getattr(target, "__name__", "")
    packet = getattr(torch.ops.aten, name, None) if name else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return [0]
    positions: set[int] = set()
    for overload in packet.overloads():
        for index, argument in enumerate(getattr(packet, overload)._schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                positions.add(index)
    return sorted(positions) or [0]


def _basic_index(index: Any) -> bool:
    """Whether `x[index]` is a view (ints, slices, None, ...), not an indexing by tensors or lists."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (int, slice, torch.SymInt)) and not isinstance(p, bool)
               for p in parts)


def _basic_view(t: torch.Tensor, index: Any) -> torch.Tensor:
    """`t[index]` for a _basic_index, made of select and slice ops: they take a symbolic int as it
    is, where C++ indexing reads its value (a guard i == 2, a recompile for every new index)."""
    parts = index if isinstance(index, tuple) else (index,)
    if sum(p is Ellipsis for p in parts) > 1:
        return t[index]  # raises as eager does
    indexed = sum(p is not None and p is not Ellipsis for p in parts)
    out, dim = t, 0
    for p in parts:
        if p is Ellipsis:
            dim += t.dim() - indexed
        elif p is None:
            out, dim = out.unsqueeze(dim), dim + 1
        elif isinstance(p, slice):
            out = torch.ops.aten.slice.Tensor(out, dim, p.start, p.stop, 1 if p.step is None else p.step)
            dim += 1
        else:
            out = torch.ops.aten.select.int(out, dim, p)
    return out


def _tensor_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among the arguments of a call, also inside lists and tuples (one level)."""
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, torch.Tensor):
                found.append(item)
    return found


_PROBE_ELEMENTS = 1 << 16  # the largest storage _eager_refusal copies the layout of


class _NoProbe(Exception):
    """An argument _eager_refusal cannot make a real twin of (a symbolic size, a large storage)."""


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


_INPLACE_OPERATORS = frozenset({"iadd", "isub", "imul", "imatmul", "itruediv", "ifloordiv", "imod", "ipow",
                                "iand", "ior", "ixor", "ilshift", "irshift"})
_INPLACE_DUNDERS = frozenset(f"__{name}__" for name in _INPLACE_OPERATORS)  # `x.__iadd__(y)` spelled out


def _is_inplace_function(target: Any) -> bool:
    name = getattr(target, "__name__", "")
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if getattr(target, "__module__", None) == "_operator":
        return name in _INPLACE_OPERATORS  # only recorded for in-place tensor updates
    # `torch._foreach_add_` and `torch._fused_adam_` are in place too; `__iadd__`-style names are not functions here
    return name.endswith("_") and not name.endswith("__") or name in ("copy_", "fill_", "zero_")


def _node_name(source: str) -> str:
    """A readable placeholder name for a source: `L['self']._modules['fc'].weight` -> `l_self_fc_weight`."""
    import re

    text = re.sub(r"\._(?:modules|parameters|buffers)\[", "[", source)
    text = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    return text or "input"
