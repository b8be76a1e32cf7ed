"""Grad-mode sweep for test_dynrepros_programs.py (registered in dynrepros_programs.PROGRAMS): each
body (an input updated in place, a view of it updated, a view of it returned, an intermediate's view
updated then its base used, a parameter updated like an optimizer step) under each grad mode (none,
no_grad, enable_grad inside no_grad, inference_mode, set_grad_enabled(False)), with the parameter
requiring grad or not, and a non-leaf input or a plain one.
"""
# ruff: noqa
# mypy: ignore-errors
import torch

from dynrepros_programs import G, R, case

def _plain(body):
    def program(x, w, *_):
        return body(x, w)
    return program


def _nograd(body):
    def program(x, w, *_):
        with torch.no_grad():
            return body(x, w)
    return program


def _enable_in_nograd(body):
    def program(x, w, *_):
        with torch.no_grad():
            with torch.enable_grad():
                return body(x, w)
    return program


def _inference(body):
    def program(x, w, *_):
        with torch.inference_mode():
            return body(x, w)
    return program


def _setgrad_off(body):
    def program(x, w, *_):
        torch.set_grad_enabled(False)
        try:
            return body(x, w)
        finally:
            torch.set_grad_enabled(True)
    return program


MODES = {"plain": _plain, "nograd": _nograd, "enable_in_nograd": _enable_in_nograd, "inference": _inference,
         "setgrad_off": _setgrad_off}


def _body_update_input(x, w):
    x.mul_(2)
    return x * w


def _body_update_view(x, w):
    x[1:].add_(w[1:])
    return x.sum(0)


def _body_return_view(x, w):
    return x.t(), x[0] * w[0]


def _body_intermediate_view(x, w):
    y = x * w
    y[:, 0].zero_()
    return y


def _body_param_step(x, w):
    w.sub_(0.1 * x)
    return w * 1


BODIES = {"upd_input": _body_update_input, "upd_view": _body_update_view, "ret_view": _body_return_view,
          "inter_view": _body_intermediate_view, "param_step": _body_param_step}


def _make(w_grad, x_kind):
    def make():
        w = G(3, 4) if w_grad else R(3, 4)
        if x_kind == "nonleaf":
            a = G(3, 4)
            return (a * 1, w, a)
        return (R(3, 4), w)
    return make


for _mode_name in MODES:
    for _body_name, _body in BODIES.items():
        for _w_grad in (True, False):
            for _x_kind in ("plain", "nonleaf"):
                _name = f"gm_{_mode_name}_{_body_name}_{'wg' if _w_grad else 'w'}_{_x_kind}"
                _ind = _body_name == "upd_view" and not _w_grad and _x_kind == "plain"
                case(_make(_w_grad, _x_kind), name=_name, ind=_ind)(MODES[_mode_name](_body))
