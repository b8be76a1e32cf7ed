"""Corpus: module trees: ModuleList/ModuleDict/Sequential/ParameterList, parameters() and buffers()
over trees (shared and recursive submodules), children and named_modules, and modules called in
different orders or passed as arguments (torch.compile's graph counts: one graph where the
module classes are the same).

The subject is the module itself or a function taking modules; each runs under fullgraph=True
unless it says otherwise.
"""
from __future__ import annotations

import torch
from torch import nn

from .modules import MLP
from .program import Program, case, fn_program, t


@case("modules")
def module_list_iterated_and_indexed():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x + self.layers[-1](x), len(self.layers)
    return Program(Stack(), ((t(2, 3),),))


@case("modules")
def module_list_slice_and_enumerate():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(4)])

        def forward(self, x):
            for i, layer in enumerate(self.layers[1:3]):
                x = layer(x) * (i + 1)
            return x
    return Program(Stack(), ((t(2),),))


@case("modules")
def module_dict_items_and_keys():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 1), "b": nn.Linear(2, 3)})

        def forward(self, x):
            outs = {name: head(x) for name, head in self.heads.items()}
            return outs, list(self.heads.keys()), "a" in self.heads
    return Program(Heads(), ((t(2),),))


@case("modules")
def sequential_indexing_and_len():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))

        def forward(self, x):
            return self.seq(x), self.seq[0](x), self.seq[-1].out_features, len(self.seq)
    return Program(Net(), ((t(2),),))


@case("modules")
def sequential_slice_called():
    seq = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 2), nn.Sigmoid())

    def f(x):
        return seq[:2](x), seq[2:](seq[:2](x))
    return fn_program(f, (t(2),))


@case("modules")
def module_list_subclass_custom_getitem_len():
    class Ring(nn.ModuleList):
        def __getitem__(self, i):
            return super().__getitem__(i % len(self))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.ring = Ring([nn.Linear(2, 2), nn.Linear(2, 2)])

        def forward(self, x):
            return self.ring[3](x), len(self.ring)
    return Program(Net(), ((t(2),),))


@case("modules")
def module_list_subclass_iterates_in_its_own_order():
    class Backwards(nn.ModuleList):
        def __iter__(self):
            return iter([self[i] for i in range(len(self) - 1, -1, -1)])

        def __len__(self):
            return len(self._modules) + 0

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = Backwards([nn.Linear(2, 3), nn.Linear(3, 2)])

        def forward(self, x):
            for layer in reversed(list(self.layers)):
                x = layer(x)
            return x, len(self.layers), [type(m).__name__ for m in self.layers]
    return Program(Net(), ((t(2),),))


@case("modules")
def module_dict_subclass_aliases_keys():
    class Aliased(nn.ModuleDict):
        def __getitem__(self, key):
            return super().__getitem__({"first": "a"}.get(key, key))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = Aliased({"a": nn.Linear(2, 2), "b": nn.Linear(2, 1)})

        def forward(self, x):
            return self.heads["first"](x), self.heads["b"](x)
    return Program(Net(), ((t(2),),))


@case("modules")
def sequential_subclass_getitem_scales_output():
    class Tagged(nn.Sequential):
        def __getitem__(self, i):
            if isinstance(i, int) and i < 0:
                raise IndexError("no negative indices here")
            return super().__getitem__(i)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = Tagged(nn.Linear(2, 2), nn.ReLU())

        def forward(self, x):
            try:
                self.body[-1]
            except IndexError:
                x = x * 2
            return self.body[0](x), self.body(x)
    return Program(Net(), ((t(2),),))


@case("modules")
def parameters_and_named_parameters_in_forward():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 1)))

        def forward(self, x):
            reg = sum(p.pow(2).sum() for p in self.parameters())
            names = [n for n, _ in self.named_parameters()]
            return self.b(self.a(x)) + reg, names
    return Program(Net(), ((t(2),),))


@case("modules")
def shared_submodule_parameters_once():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            shared = nn.Linear(2, 2)
            self.first = shared
            self.second = shared

        def forward(self, x):
            return self.second(self.first(x)), len(list(self.parameters()))
    return Program(Net(), ((t(2),),))


@case("modules")
def buffers_and_named_buffers():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(2))
            self.register_buffer("count", torch.tensor(0))
            self.register_buffer("scratch", torch.ones(2), persistent=False)

        def forward(self, x):
            self.mean.mul_(0.5).add_(x.mean(0) * 0.5)
            self.count += 1
            return x - self.mean + self.scratch, [n for n, _ in self.named_buffers()]
    return Program(Net(), ((t(3, 2),), (t(3, 2),)))


@case("modules")
def modules_children_named_modules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
            self.dec = nn.Linear(2, 2)

        def forward(self, x):
            linears = [m for m in self.modules() if isinstance(m, nn.Linear)]
            for m in linears:
                x = m(x)
            return x, [n for n, _ in self.named_modules()], len(list(self.children()))
    return Program(Net(), ((t(2),),))


@case("modules", counts=True)
def submodules_called_in_different_orders():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def forward(self, x, order):
            for name in order:
                x = getattr(self, name)(x)
            return x

    return Program(Net(), ((t(2), ("a", "b")), (t(2), ("b", "a")), (t(2), ("a", "b"))))


@case("modules", counts=True)
def separate_modules_of_same_class_compiled_by_function():
    layers = [nn.Linear(2, 2) for _ in range(4)]

    def f(x, layer):
        return torch.relu(layer(x))
    return Program(f, tuple((t(2), layer) for layer in layers))


@case("modules")
def module_with_parameter_list_and_dict():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = nn.ParameterList([nn.Parameter(torch.ones(2) * k) for k in range(3)])
            self.pd = nn.ParameterDict({"s": nn.Parameter(torch.ones(2))})

        def forward(self, x):
            for w in self.ws:
                x = x * w + 1
            return x + self.pd["s"], len(self.ws)
    return Program(Net(), ((t(2),),))


@case("modules")
def module_sub_forward_reads_parent_config():
    class Block(nn.Module):
        def __init__(self, parent_scale):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.scale = parent_scale

        def forward(self, x):
            return self.lin(x) * self.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(k + 1) for k in range(2)])

        def forward(self, x):
            return sum(b(x) for b in self.blocks)
    return Program(Net(), ((t(2),),))


@case("modules")
def module_zero_grad_and_named_parameters_filter():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

        def forward(self, x):
            trainable = [n for n, p in self.named_parameters() if p.requires_grad]
            return self.lin(x) + self.frozen, trainable
    return Program(Net(), ((t(2),),))


@case("modules")
def recursive_module_tree_parameters():
    class Node(nn.Module):
        def __init__(self, depth):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.child = Node(depth - 1) if depth > 0 else None

        def forward(self, x):
            x = self.lin(x)
            return self.child(x) if self.child is not None else x

    class Tree(nn.Module):
        def __init__(self):
            super().__init__()
            self.root = Node(3)

        def forward(self, x):
            return self.root(x), sum(p.numel() for p in self.parameters())
    return Program(Tree(), ((t(2),),))


@case("modules")
def module_state_dict_keys_in_forward():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x), len(self._parameters), len(self._modules)
    return Program(Net(), ((t(2),),))


@case("modules", counts=True)
def module_arguments_swapped_between_calls():
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)

    def f(x, a, b):
        return b(torch.relu(a(x)))
    return Program(f, ((t(2), first, second), (t(2), second, first), (t(2), first, second),
                       (t(2), second, first)))


@case("modules", counts=True)
def module_list_argument_in_varying_orders():
    blocks = [nn.Linear(2, 2) for _ in range(3)]

    def f(x, mods):
        for m in mods:
            x = m(x).tanh()
        return x
    orders = ([0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 2, 1])
    return Program(f, tuple((t(2), [blocks[i] for i in order]) for order in orders))


@case("modules", counts=True)
def submodule_picked_by_index_argument():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

        def forward(self, x, i):
            return self.experts[i](x)
    return Program(Net(), ((t(2), 0), (t(2), 1), (t(2), 2), (t(2), 0)))


@case("modules", counts=True)
def two_instances_of_one_module_class_through_a_function():
    a, b = MLP(), MLP()

    def f(x, model):
        return model(x).sum(-1)
    return Program(f, ((t(1, 4), a), (t(1, 4), b), (t(1, 4), a), (t(1, 4), b)))


# ---------------------------------------------------------------- containers changed inside forward
# nn.Module.__setattr__/__delattr__ and ModuleList's renumbering reach `_modules`: the children the
# trace iterates after the change are the changed ones (a replaced layer once ran the old one).

@case("modules")
def module_list_item_replaced_then_iterated():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Sigmoid(), nn.Sigmoid(), nn.Sigmoid()])

        def forward(self, x):
            self.layers[-1] = nn.Softplus()
            self.layers[0] = nn.Hardtanh(-0.5, 0.5)
            for layer in self.layers:
                x = layer(x) * 3
            return x, type(self.layers[2]).__name__
    return Program(Stack(), ((t(2, 4),), (t(2, 4),)))


@case("modules")
def module_list_grown_in_forward_then_indexed():
    class Growing(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4)])

        def forward(self, x):
            if len(self.blocks) < 3:
                self.blocks.append(nn.Tanh())
            self.blocks.insert(1, nn.ReLU())
            out = self.blocks[-1](self.blocks[1](x))
            del self.blocks[1]
            return out, len(self.blocks), [type(b).__name__ for b in self.blocks]
    return Program(Growing(), ((t(3, 4),), (t(3, 4),), (t(3, 4),)))


@case("modules")
def module_list_item_deleted_then_renumbered_names_read():
    class Pruned(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), nn.Sigmoid()])

        def forward(self, x):
            if len(self.layers) == 4:
                del self.layers[1]
            second = getattr(self.layers, "1")  # the old "2", renumbered
            for layer in self.layers:
                x = layer(x)
            return x + second(x), list(self.layers._modules)
    return Program(Pruned(), ((t(2, 3),), (t(2, 3),)))


@case("modules")
def module_dict_entries_set_and_popped_in_forward():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"gelu": nn.GELU(), "relu": nn.ReLU()})

        def forward(self, x):
            self.heads["tanh"] = nn.Tanh()
            dropped = self.heads.pop("relu")
            ys = [m(x) * i for i, (k, m) in enumerate(self.heads.items())]
            self.heads["relu"] = dropped
            return sum(ys), list(self.heads.keys()), "tanh" in self.heads
    return Program(Heads(), ((t(2, 3),), (t(2, 3),)))


@case("modules")
def submodule_set_to_none_in_forward_then_tested():
    class Optional(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(3)
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            x = self.lin(x)
            if self.norm is not None:
                x = self.norm(x)
                self.norm = None
            return x, self.norm is None, "norm" in self._modules
    return Program(Optional(), ((t(2, 3),), (t(2, 3),)))


@case("modules")
def sequential_appended_in_forward_then_called():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(3, 3))

        def forward(self, x):
            if len(self.seq) == 1:
                self.seq.append(nn.Sigmoid())
            return self.seq(x), type(self.seq[-1]).__name__, len(self.seq)
    return Program(Head(), ((t(2, 3),), (t(2, 3),)))
