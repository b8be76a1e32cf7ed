"""The Python object model inside compiled code: int()/float() of user objects through their number
methods, the TypeError text of an operator no class answers, the class of a Parameter subclass,
and Python attributes set on input tensors (read, written, guarded). Each program is compiled
whole and checked against eager and torch.compile (trace_oracle.check_traced)."""
from __future__ import annotations

import torch

import kiln
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


# ------------------------------------------------------------------ int() and float() of user objects
class Both:
    def __float__(self):
        return 2.5

    def __int__(self):
        return 3


class OnlyIndex:
    def __index__(self):
        return 4


class FloatGivesInt:
    def __float__(self):
        return 1


class IntGivesFloat:
    def __int__(self):
        return 1.5


class Plain:
    pass


class Ratio:
    def __init__(self, num, den):
        self.num, self.den = num, den

    def __float__(self):
        return self.num / self.den

    def __int__(self):
        return self.num // self.den


def _type_error_text(thunk):
    try:
        thunk()
    except TypeError as exc:
        return str(exc)
    return None


def test_int_and_float_call_the_python_methods() -> None:
    def f(x):
        return x * float(Both()) + int(Both())
    check_traced(f, fresh(X))


def test_index_answers_int_and_float() -> None:
    def f(x):
        return x * int(OnlyIndex()) + float(OnlyIndex()), type(float(OnlyIndex())).__name__
    check_traced(f, fresh(X))


def test_number_methods_read_the_object_state() -> None:
    def f(x):
        r = Ratio(7, 2)
        return x * float(r) - int(r)
    check_traced(f, fresh(X))


def test_wrong_result_types_raise_eagers_type_error() -> None:
    def f(x):
        texts = _type_error_text(lambda: float(FloatGivesInt())), _type_error_text(lambda: int(IntGivesFloat()))
        return x + 1, texts
    check_traced(f, fresh(X))


def test_object_without_number_methods_raises_eagers_type_error() -> None:
    def f(x):
        return x - 1, _type_error_text(lambda: int(Plain())), _type_error_text(lambda: float(Plain()))
    check_traced(f, fresh(X))


# ------------------------------------------------------------------ operators no class answers
class NoAdd:
    def __add__(self, other):
        return NotImplemented


def test_unsupported_operand_text_names_both_types() -> None:
    def f(x):
        texts = [_type_error_text(lambda: NoAdd() + 1), _type_error_text(lambda: 2 * Plain()),
                 _type_error_text(lambda: 1 - Plain())]
        return x * len(texts), texts
    check_traced(f, fresh(X))


def test_unsupported_power_and_inplace_text() -> None:
    def f(x):
        def inplace():
            p = Plain()
            p += 1
        texts = _type_error_text(lambda: Plain() ** 2), _type_error_text(inplace), _type_error_text(lambda: Plain() @ 3)
        return x, texts
    check_traced(f, fresh(X))


# ------------------------------------------------------------------ Parameter subclasses
class TaggedParam(torch.nn.Parameter):
    pass


class QuantParam(torch.nn.Parameter):
    bits = 8


class TwoParams(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = TaggedParam(torch.randn(3))
        self.b = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        out = x
        for p in self.parameters():
            out = out + p if isinstance(p, TaggedParam) else out * p
        return out, type(self.a).__name__, self.a.__class__.__name__, type(self.b) is torch.nn.Parameter


def test_parameter_subclass_keeps_its_class_in_a_module() -> None:
    torch.manual_seed(0)
    check_traced(TwoParams(), fresh(X))


def test_parameter_subclass_argument_type_and_class_attribute() -> None:
    def f(x, p):
        return x * p * p.bits, type(p) is QuantParam, isinstance(p, QuantParam), isinstance(p, TaggedParam)
    check_traced(f, fresh(X, QuantParam(torch.ones(3))))


def test_parameter_subclass_type_recompiles_for_another_class() -> None:
    def f(x, p):
        return x + p if type(p) is TaggedParam else x - p
    compiled = kiln.compile(f, backend="eager")
    for p in (TaggedParam(torch.ones(3)), torch.nn.Parameter(torch.ones(3)), TaggedParam(torch.ones(3))):
        torch.testing.assert_close(compiled(X, p), f(X, p))


# ------------------------------------------------------------------ Python attributes of input tensors
def _with(t, **attrs):
    for name, value in attrs.items():
        setattr(t, name, value)
    return t


def test_attribute_of_input_tensor_read() -> None:
    def f(x):
        return x * x.scale
    check_traced(f, lambda: (_with(X.clone(), scale=3.0),))


def test_attribute_of_parameter_read_in_module() -> None:
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))
            self.w.lr_mult = 2.0

        def forward(self, x):
            return x * self.w * self.w.lr_mult
    check_traced(M(), fresh(X))


def test_attribute_of_input_tensor_written_then_read() -> None:
    def f(x):
        x.tag = "seen"
        x.count = getattr(x, "count", 0) + 1
        return x * x.count, hasattr(x, "tag"), x.tag
    check_traced(f, fresh(X))
    x = X.clone()
    compiled = kiln.compile(f, backend="eager")
    compiled(x)
    compiled(x)
    assert x.tag == "seen" and x.count == 2


def test_attribute_of_input_tensor_changed_between_calls_is_guarded() -> None:
    def f(x):
        return x * x.gain
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    x = _with(X.clone(), gain=2.0)
    torch.testing.assert_close(compiled(x), X * 2.0)
    x.gain = 5.0
    torch.testing.assert_close(compiled(x), X * 5.0)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["recompiles"] == 1, kiln.stats()
    del x.gain
    try:
        compiled(x)
    except AttributeError:
        pass
    else:
        raise AssertionError("the attribute is gone: eager raises AttributeError")


class ScaledParam(torch.nn.Parameter):
    factor = 3

    def scaled(self, k=1):
        return self * self.factor * k

    @property
    def doubled(self):
        return self * 2

    def sum(self):  # overrides Tensor.sum
        return super().sum() + 100


class WithScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = ScaledParam(torch.ones(3))

    def forward(self, x):
        return x + self.p.scaled(k=2) + self.p.doubled, self.p.sum()


def test_parameter_subclass_methods_and_properties() -> None:
    check_traced(WithScaled(), fresh(X))


def test_parameter_subclass_class_attribute_changed_between_calls() -> None:
    class Bits(torch.nn.Parameter):
        bits = 4
    m = torch.nn.Module()
    m.p = Bits(torch.ones(3))

    def f(x):
        return x * m.p.bits
    kiln.reset()
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(X), X * 4)
    Bits.bits = 2
    torch.testing.assert_close(compiled(X), X * 2)
    assert kiln.stats()["recompiles"] == 1, kiln.stats()


# ------------------------------------------------------------------ unset __slots__ members of objects from outside
class Slots:
    __slots__ = ("k", "j")


def _slotted(**values):
    s = Slots()
    for name, value in values.items():
        setattr(s, name, value)
    return s


def test_unset_slot_read_raises_attribute_error_in_trace() -> None:
    s = _slotted(j=1)

    def f(x):
        try:
            return x * s.k
        except AttributeError as exc:
            return x - s.j, str(exc)
    check_traced(f, fresh(X))


def test_hasattr_of_unset_slot() -> None:
    s = _slotted(k=2)

    def f(x):
        return x + hasattr(s, "j") + hasattr(s, "k")
    check_traced(f, fresh(X))


def test_slot_deleted_and_set_between_calls() -> None:
    s = _slotted(k=2)

    def f(x):
        try:
            return x * s.k
        except AttributeError:
            return x - 100
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for change in (None, lambda: delattr(s, "k"), None, lambda: setattr(s, "k", 5)):
        if change is not None:
            change()
        torch.testing.assert_close(compiled(X), f(X))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()


# ------------------------------------------------------------------ Parameter subclasses with their own torch-function
class TimesTen(torch.nn.Parameter):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out * 10 if getattr(func, "__name__", "") in ("mul", "add") else out


class TimesTenModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = TimesTen(torch.ones(3))

    def forward(self, x):
        return (x * self.w).sum(), torch.add(x, self.w)


def test_parameter_subclass_with_torch_function_keeps_its_handler() -> None:
    for backend in ("aot_eager", "eager"):
        kiln.reset()
        m = TimesTenModule()
        got, want = kiln.compile(m, backend=backend)(X), m(X)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.detach(), w.detach())


def test_parameter_subclass_with_torch_function_as_argument() -> None:
    def f(x, p):
        return x * p + 1
    kiln.reset()
    p = TimesTen(torch.full((3,), 2.0))
    torch.testing.assert_close(kiln.compile(f, backend="aot_eager")(X, p).detach(), f(X, p).detach())


# ------------------------------------------------------------------ a tensor left of a user class's reflected operator
class Reflected:
    def __init__(self, t):
        self.t = t

    def __radd__(self, other):
        return Reflected(other + self.t)

    def __rsub__(self, other):
        return Reflected(other - self.t * 2)

    def __rmatmul__(self, other):
        return Reflected(other @ self.t)

    def __rmul__(self, other):
        return ("rmul", other * 3)


def test_tensor_left_operand_runs_the_reflected_method() -> None:
    def f(x):
        return (x + Reflected(x)).t, (x - Reflected(x)).t, (x * Reflected(x))[1]
    check_traced(f, fresh(X), oracle=False)  # torch.compile breaks on one of them


def test_tensor_left_operand_matmul_and_inplace() -> None:
    def f(m):
        acc = m.clone()
        acc += Reflected(m)
        return (m @ Reflected(m)).t, acc.t
    check_traced(f, fresh(torch.randn(2, 2)), oracle=False)  # torch.compile breaks on these


def test_tensor_and_object_without_reflected_method_raise_type_error() -> None:
    def f(x):
        return x + 1, _type_error_text(lambda: x + Plain()), _type_error_text(lambda: Plain() - x)
    check_traced(f, fresh(X))
