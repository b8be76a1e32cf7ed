"""A torch function that something has wrapped with functools.wraps is still known for what it is.
Importing torch._dynamo replaces torch.manual_seed with a torch._disable_dynamo wrapper; capture
then called the wrapper as an op ('an op returned Generator') instead of breaking on manual_seed
(seen in a loop inside an autograd.Function's forward, captured frame by frame without grad). The
check runs in a fresh process: this suite's own imports already decide which manual_seed Kiln saw."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import torch
    import kiln

    class Reseeding(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, layers):
            for scale in layers:
                torch.manual_seed(0)
                x = x * scale + torch.rand(x.shape)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    def layers_fn(x, layers):
        return Reseeding.apply(x.sin(), layers).cos()

    x, layers = torch.randn(3), (2.0, 3.0)
    with torch.no_grad():
        kiln.explain(layers_fn)(x, layers)  # a first capture with the plain function
    kiln.reset()
    torch.manual_seed = torch._disable_dynamo(torch.random.manual_seed)  # what importing torch._dynamo does
    with torch.no_grad():
        out = kiln.explain(layers_fn)(x, layers)
        assert not out.fallbacks, out
        reasons = [b.reason for b in out.break_reasons]
        assert reasons and all("manual_seed" in r for r in reasons), reasons
        torch.testing.assert_close(kiln.compile(layers_fn, backend="eager")(x, layers), layers_fn(x, layers))
    print("ok")
''')


def test_manual_seed_wrapped_as_dynamo_wraps_it_still_breaks_as_random(tmp_path) -> None:
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=root,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "KILN_CACHE_DIR": str(tmp_path)},
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr[-3000:]
