"""Probe harness: my own Dynamo-style programs judged by tests/capture/corpus/oracle.py."""
from __future__ import annotations
import sys, os, signal, json, time, traceback
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "capture"))
from corpus.program import Program, Case, Call, kw, t, fn_program  # noqa
from corpus import oracle

import kiln as _kiln, types as _types
if os.environ.get("BACKEND"):
    _b = os.environ["BACKEND"]
    _shim = _types.SimpleNamespace(**{k: getattr(_kiln, k) for k in dir(_kiln) if not k.startswith("__")})
    _shim.compile = lambda subj, backend=None, fullgraph=False: _kiln.compile(subj, backend=_b, fullgraph=fullgraph)
    oracle.kiln = _shim
    if os.environ.get("FALLBACK_RANDOM"):
        import kiln.config
        kiln.config.fallback_random = True

_orig_snapshot = oracle.snapshot
def _snap(value, depth=0):
    import torch
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
        value = value.as_subclass(torch.Tensor)
    return _orig_snapshot(value, depth)
oracle.snapshot = _snap

PROBES: dict[str, Case] = {}

def case(category, *, fullgraph=False, counts=True):
    def register(build):
        name = build.__name__
        assert name not in PROBES, name
        PROBES[name] = Case(name, category, build, fullgraph, counts)
        return build
    return register

class Timeout(Exception):
    pass

def _alarm(*a):
    raise Timeout()

def run(names=None, out="results.json"):
    import importlib, glob
    for f in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "p_*.py"))):
        importlib.import_module(os.path.basename(f)[:-3])
    results = {}
    signal.signal(signal.SIGALRM, _alarm)
    for name, c in PROBES.items():
        if names and not any(name.startswith(n) for n in names):
            continue
        signal.alarm(60)
        t0 = time.time()
        try:
            o = oracle.judge(c)
            r = dict(cat=c.category, torch_passes=o.torch_passes, torch_why=o.torch_why, kiln=o.kiln,
                     why=o.kiln_why, tg=o.torch_graphs, kg=o.kiln_graphs, kb=o.kiln_breaks)
        except Timeout:
            r = dict(cat=c.category, kiln="timeout", torch_passes=None)
        except Exception as e:
            r = dict(cat=c.category, kiln="harness", why=repr(e)[:300], torch_passes=None)
        finally:
            signal.alarm(0)
        r["s"] = round(time.time() - t0, 1)
        results[name] = r
        tag = r["kiln"]
        if r.get("torch_passes") and r["kiln"] == "pass" and r.get("kg", 0) > r.get("tg", 0):
            tag = "extra_graphs"
        print(f"{tag:12s} {name} torch={r.get('torch_passes')} g={r.get('kg')}/{r.get('tg')} {r.get('why') or ''} {'' if r.get('torch_passes') else r.get('torch_why')}"[:400], flush=True)
    json.dump(results, open(out, "w"), indent=1, default=str)
    return results

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness
    harness.run(sys.argv[1:] or None, out=os.environ.get("OUT", "results.json"))
