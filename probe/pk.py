"""Probe helpers: drive a subject and describe outputs with tensor metadata (strides, aliasing, versions)."""
import torch
from harness import Program


def _desc(v, ins):
    if isinstance(v, torch.Tensor):
        alias = -1
        try:
            sp = v.untyped_storage().data_ptr()
            for i, a in enumerate(ins):
                if a.untyped_storage().data_ptr() == sp and sp != 0:
                    alias = i
                    break
        except Exception:
            pass
        return ("T", v.detach().clone(), v.dtype, tuple(v.shape), v.stride(), v.storage_offset(), v.requires_grad,
                v.is_leaf, alias, v.is_contiguous())
    if isinstance(v, (tuple, list)):
        return tuple(_desc(x, ins) for x in v)
    return v


def drv(fn, *args, grad=False, strides=True, gradmode=None):
    """A Program whose drive calls fn(*args) once or twice and describes outputs, inputs, versions, grads."""
    def drive(sub):
        ins = [a for a in args if isinstance(a, torch.Tensor)]
        v0 = [a._version for a in ins]
        res = []
        for _ in range(2):
            out = sub(*args)
            d = _desc(out, ins)
            if not strides:
                d = _strip(d)
            res.append(d)
            res.append(tuple(a.detach().clone() for a in ins))
            res.append(tuple(a._version > v for a, v in zip(ins, v0)))
            if grad:
                outs = out if isinstance(out, (tuple, list)) else (out,)
                tot = None
                for o in outs:
                    if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point:
                        s = (o * torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape).to(o.dtype)).sum()
                        tot = s if tot is None else tot + s
                if tot is not None:
                    tot.backward()
                leaves = [a for a in ins if a.is_leaf and a.requires_grad]
                res.append(tuple(None if a.grad is None else a.grad.clone() for a in leaves))
                for a in leaves:
                    a.grad = None
        return res
    return Program(fn, drive=drive)


def _strip(d):
    if isinstance(d, tuple) and d and d[0] == "T":
        return d[:4] + d[6:9]
    if isinstance(d, tuple):
        return tuple(_strip(x) for x in d)
    return d
