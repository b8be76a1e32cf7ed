import torch, functools, enum
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

def _relu(v):
    return v.relu()

def _sig(v):
    return v.sigmoid()

ACT = _relu

@case("guards")
def gd_global_function_rebound():
    def f(x):
        return ACT(x) + 1
    globals()["ACT"] = _relu
    def between(s, i):
        globals()["ACT"] = _sig
    return fn_program(f, (t(3),), (t(3),), between=between)

@case("guards")
def gd_class_method_monkeypatched():
    class K:
        def go(self, v):
            return v + 1
    k = K()
    def f(x):
        return k.go(x)
    def between(s, i):
        K.go = lambda self, v: v * 100
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_instance_method_overridden_on_instance():
    class K:
        def go(self, v):
            return v + 1
    k = K()
    def f(x):
        return k.go(x)
    def between(s, i):
        k.go = lambda v: v - 100
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_defaults_changed():
    def g(v, k=2):
        return v * k
    def f(x):
        return g(x)
    def between(s, i):
        g.__defaults__ = (7,)
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_kwdefaults_changed():
    def g(v, *, k=2):
        return v * k
    def f(x):
        return g(x)
    def between(s, i):
        g.__kwdefaults__ = {"k": 9}
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_modulelist_appended_between_calls():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ls = nn.ModuleList([nn.Linear(2, 2)])
        def forward(self, x):
            for l in self.ls:
                x = l(x)
            return x
    def between(s, i):
        s.ls.append(nn.Linear(2, 2))
    return Program(M(), ((t(1, 2),), (t(1, 2),)), between=between)

@case("guards")
def gd_dict_key_order_changes():
    d = {"a": 1, "b": 2}
    def f(x):
        return [k for k in d], x * list(d.values())[0]
    def between(s, i):
        v = d.pop("a")
        d["a"] = v
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_input_view_vs_base():
    def f(x):
        x.add_(1)
        return x * 2
    base = torch.zeros(6)
    return fn_program(f, (torch.zeros(3),), (base[1:4],), (base[::2],), observe=lambda: base)

@case("guards")
def gd_list_of_tensors_dtype_changes():
    def f(xs):
        return sum(xs)
    return fn_program(f, ([t(2), t(2)],), ([t(2), t(2, dtype=torch.float64)],))

@case("guards")
def gd_object_type_changes_same_attrs():
    class A:
        def __init__(self):
            self.v = 2
        def go(self, x):
            return x * self.v
    class B:
        def __init__(self):
            self.v = 2
        def go(self, x):
            return x + self.v
    def f(x, o):
        return o.go(x)
    return fn_program(f, (t(2), A()), (t(2), B()))

@case("guards")
def gd_grad_mode_and_default_dtype_between_calls():
    def f(x):
        return torch.ones(2) + x, torch.ones(2).dtype
    def between(s, i):
        torch.set_default_dtype(torch.float64 if i == 1 else torch.float32)
    return fn_program(f, (t(2),), (t(2),), (t(2),), between=between)

@case("guards")
def gd_string_arg_changes():
    def f(x, mode):
        if mode == "add":
            return x + 1
        elif mode == "mul":
            return x * 3
        return x
    return fn_program(f, (t(2), "add"), (t(2), "mul"), (t(2), "none"))

@case("guards")
def gd_tuple_length_changes():
    def f(x, dims):
        return x.sum(dims) if len(dims) else x
    return fn_program(f, (t(2, 3, 4), (0,)), (t(2, 3, 4), (0, 2)), (t(2, 3, 4), ()))

@case("guards")
def gd_none_vs_tensor_arg():
    def f(x, bias=None):
        if bias is not None:
            x = x + bias
        return x * 2
    return fn_program(f, (t(2), None), (t(2), t(2)), (t(2), None))

@case("guards")
def gd_kwargs_order_and_presence():
    def f(x, **kw):
        return x * sum(kw.values()), list(kw)
    return fn_program(f, kw(t(2), a=1, b=2), kw(t(2), b=2, a=1), kw(t(2), a=1))

@case("guards")
def gd_set_contents_change():
    s = {1, 2}
    def f(x):
        return x * (3 in s) + len(s)
    def between(s_, i):
        s.add(3)
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_partial_keywords_change():
    p = functools.partial(torch.add, alpha=1)
    def f(x, y):
        return p(x, y)
    def between(s, i):
        globals()["_P"] = None
        p.keywords["alpha"] = 5
    return fn_program(f, (t(2), t(2)), (t(2), t(2)), between=between)

@case("guards")
def gd_channels_last_input():
    def f(x):
        return (x * 2).stride(), x.is_contiguous()
    x = t(1, 2, 3, 3)
    return fn_program(f, (x,), (x.to(memory_format=torch.channels_last),))

@case("guards")
def gd_enum_arg_changes():
    class C(enum.Enum):
        X = 1
        Y = 2
    def f(x, c):
        return x * c.value
    return fn_program(f, (t(2), C.X), (t(2), C.Y))

@case("guards")
def gd_instance_dict_attr_deleted_falls_to_class():
    class K:
        v = 1
    k = K()
    k.v = 10
    def f(x):
        return x * k.v
    def between(s, i):
        del k.v
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_nested_list_mutated_between():
    cfg = {"layers": [1, 2]}
    def f(x):
        for s in cfg["layers"]:
            x = x * s
        return x
    def between(s, i):
        cfg["layers"].append(3)
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_tensor_attribute_on_object_replaced_shape():
    class H: pass
    h = H(); h.w = torch.ones(2)
    def f(x):
        return x @ h.w if h.w.dim() == 1 else x
    def between(s, i):
        h.w = torch.ones(2, 2)
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_module_training_of_submodule():
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.9))
    def between(s, i):
        m[1].eval()
    return Program(m, ((t(1, 2),), (t(1, 2),)), between=between)

@case("guards")
def gd_int_attribute_of_module_changes():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2
        def forward(self, x):
            return x * self.k
    def between(s, i):
        s.k = 3
    return Program(M(), ((t(2),), (t(2),)), between=between)

@case("guards")
def gd_bool_attr_on_compiled_module_wrapper():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.flag = True
        def forward(self, x):
            return x + 1 if self.flag else x - 1
    def between(s, i):
        s.flag = False
    return Program(M(), ((t(2),), (t(2),)), between=between)

@case("guards")
def gd_numpy_array_values_change():
    import numpy as np
    arr = np.array([1.0, 2.0], dtype=np.float32)
    def f(x):
        return x * torch.from_numpy(arr)
    def between(s, i):
        arr[0] = 50.0
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_closure_list_contents_change():
    steps = [1]
    def f(x):
        return x * len(steps) + steps[-1]
    def between(s, i):
        steps.append(5)
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_tensor_global_replaced_with_different_shape():
    def f(x):
        return x + G_W
    globals()["G_W"] = torch.ones(2)
    def between(s, i):
        globals()["G_W"] = torch.ones(1) * 4
    return fn_program(f, (t(2),), (t(2),), between=between)
G_W = None

@case("guards")
def gd_class_attribute_via_subclass_override():
    class A:
        k = 1
    class B(A):
        pass
    b = B()
    def f(x):
        return x * b.k
    def between(s, i):
        B.k = 8
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_torch_function_swapped_global():
    def f(x):
        return OPS["act"](x)
    OPS["act"] = torch.relu
    def between(s, i):
        OPS["act"] = torch.tanh
    return fn_program(f, (t(3),), (t(3),), between=between)
OPS = {}

@case("guards")
def gd_tensor_requires_grad_in_list():
    def f(xs):
        return [v * 2 for v in xs]
    return fn_program(f, ([t(2)],), ([t(2, requires_grad=True)],))

@case("guards")
def gd_id_dict_key_object_swapped():
    class K: pass
    k1, k2 = K(), K()
    table = {k1: 1.0}
    cur = [k1]
    def f(x):
        return x * table.get(cur[0], -1.0)
    def between(s, i):
        cur[0] = k2
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_sizes_of_list_of_tensors():
    def f(xs):
        return torch.cat(xs).shape[0], torch.cat(xs).sum()
    return fn_program(f, ([t(2), t(3)],), ([t(4), t(3)],))

@case("guards")
def gd_method_defaults_via_self_attr():
    class M:
        def __init__(self):
            self.scale = 1.0
        def go(self, x, scale=None):
            return x * (scale if scale is not None else self.scale)
    m = M()
    def f(x):
        return m.go(x), m.go(x, 3.0)
    def between(s, i):
        m.scale = 2.5
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("guards")
def gd_deterministic_flag_branch():
    def f(x):
        if torch.are_deterministic_algorithms_enabled():
            return x + 1
        return x - 1
    def between(s, i):
        torch.use_deterministic_algorithms(i == 1)
    return fn_program(f, (t(2),), (t(2),), (t(2),), between=between)
