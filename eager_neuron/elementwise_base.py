"""What plain eager's elementwise kernels and adaptive eager's fused kernels share: the preludes
their sources start with, the preludes' digest (part of every elementwise kernel's key) and the
size from which a kernel runs in parallel.

A neutral module: lower/elementwise.py (which imports adaptive eager) and adaptive eager's flush
(eager_neuron/adaptive_launch.py) both read it, so the flush never imports the lowering.

>>> from eager_neuron import elementwise_base as ewb
>>> ewb.PARALLEL_MIN >= 1 and len(ewb.PRELUDE_ID) == 10
True
"""

from __future__ import annotations

import hashlib

from .kernels import vmath as _vmath
from .kernels.elementwise_prelude import PRELUDE
from .lower import special as _special

PARALLEL_MIN = 1 << 18   # below this a prange launch costs more than it saves
# special functions (lower/special.py, kernels/special.py): their source is added to a kernel
# only when its expression calls one
SPECIAL_PRELUDE = _special.PRELUDE
SPECIAL_RE = _special.HELPER_RE
# the preludes are part of the kernels' source: their hash is part of every kernel's key
PRELUDE_ID = hashlib.sha1((PRELUDE + SPECIAL_PRELUDE + _vmath.VMATH_PRELUDE).encode()
                          ).hexdigest()[:10]

__all__ = ["PARALLEL_MIN", "PRELUDE", "PRELUDE_ID", "SPECIAL_PRELUDE", "SPECIAL_RE"]
