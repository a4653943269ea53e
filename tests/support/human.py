"""What a human-facing output must never contain: a float's repr (``23.431637549999976``,
``6.2e-05``). A UUID's ``8e-7`` is not one (preceded by a word character)."""

from __future__ import annotations

import re

FLOAT_REPR = re.compile(r"(?<![\w-])\d+\.\d{5,}|(?<![\w-])\d(?:\.\d+)?e-\d")
