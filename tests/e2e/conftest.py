"""Makes the repository root importable for the e2e corpus (it compiles `examples.gpt`), also when
pytest is started as a bare `pytest` rather than `python -m pytest` from the root."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
