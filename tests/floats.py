"""How closely two computations of the same numbers must agree: one tolerance, and why.

Two code paths that compute the same mathematics sum their float32 terms in different orders, and
float32 addition is not associative. Which order a kernel takes depends on the library and on the
processor: Flower's FedAvg sums the clients' arrays in NumPy, one client after another, where the
package's weighted mean is one float32 GEMV, whose MKL kernel on an AVX-512 Intel Xeon sums in
another order than on an AVX2 AMD EPYC. One aggregation then differs in the last bit (1 ulp,
6e-8 relative), a short run's losses by ~1e-8 to 1e-7 after a few rounds, and FedMCSA's σ = 50 turns
a last-bit difference in a cosine into ~1e-6 in what it sends. A change to what a method computes
moves these figures by far more: the two closest recorded methods, FedAvg and FedProx with
μ = 0.01, differ by 3e-4 (``tests/methods/recorded.json``).

So a comparison of two different computations (a method at a zero weight against the method it
reduces to; a user's own loop against the package's; a run against figures recorded on another
processor) uses ``REL`` and ``ABS``. Bitwise equality stays where the computation is the same: the
same code and seed in another process or API (resume, the two Flower APIs' twins, ``flwr run``
against in-process).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

#: relative tolerance for two computations of the same numbers (see the module docstring)
REL = 1e-5
#: absolute tolerance, for values near zero (a parameter, a loss that vanishes)
ABS = 1e-6


def same_math(expected: Any) -> Any:
    """``pytest.approx(expected)`` within what reordered float32 sums allow."""
    return pytest.approx(expected, rel=REL, abs=ABS)


def isclose(a: float, b: float) -> bool:
    """``math.isclose`` within what reordered float32 sums allow."""
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


def assert_same_math(actual: torch.Tensor, expected: torch.Tensor, msg: str | None = None) -> None:
    """``actual`` and ``expected`` (tensors) agree within what reordered float32 sums allow."""
    torch.testing.assert_close(actual, expected, rtol=REL, atol=ABS, msg=msg)
