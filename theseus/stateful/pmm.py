"""AffineEigenvaluePMM: the affine eigenvalue parametric matrix model.

For an input x with p features it forms the Hermitian n x n matrix

    M(x) = M0 + sum_i x_i M_i,        i = 1..p,

and outputs its k smallest eigenvalues, ascending. Each Hermitian matrix is stored as one
real n x n array (``hermitian``), so gradient steps keep it Hermitian and the (p + 1) n^2
trainable floats are exactly its degrees of freedom.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from theseus.config import field
from theseus.stateful.base import Forward
from theseus.stateful.params import Parametric


class AffineEigenvaluePMM(Parametric):
    """``x: [N, p] -> the k smallest eigenvalues of M(x): [N, k]``; params ``(A0 [n, n], A [p, n, n])``,
    with ``M0 = hermitian(A0)`` and ``M_i = hermitian(A[i])``. Entries start normal with variance 1/n."""

    n: int = field("architecture.pmm.n", default=4, help="size of the PMM's Hermitian matrices")
    k: int = field("architecture.pmm.k", default=1, help="eigenvalues the PMM outputs, smallest first (k <= n)")

    def __post_init__(self) -> None:
        self.check_sizes()

    def check_sizes(self) -> None:
        """ValueError unless 1 <= k <= n."""
        if not 1 <= self.k <= self.n:
            raise ValueError(f"AffineEigenvaluePMM needs 1 <= k <= n, got n={self.n}, k={self.k}")

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        self.check_sizes()
        if len(input_shape) != 1:
            raise ValueError(f"AffineEigenvaluePMM expects input shape (features,), got {tuple(input_shape)}")
        return (self.k,)

    def init(self, rng: Any, input_shape: tuple[int, ...]) -> tuple[jax.Array, ...]:
        (p,) = input_shape
        a = jax.random.normal(rng, (p + 1, self.n, self.n), jnp.float32) / jnp.sqrt(self.n)
        return a[0], a[1:]

    def check_params(self, params: tuple[jax.Array, ...]) -> None:
        got = [p.shape for p in params]
        n = self.n
        if not (len(got) == 2 and got[0] == (n, n) and len(got[1]) == 3 and got[1][1:] == (n, n)):
            raise ValueError(f"AffineEigenvaluePMM(n={n}) takes params (A0 [{n}, {n}], A [p, {n}, {n}]), got shapes {got}")
        if any(jnp.iscomplexobj(p) for p in params):
            raise ValueError("AffineEigenvaluePMM params are real arrays (each encodes a Hermitian matrix)")

    def _get_callable(self) -> Forward:
        k = self.k

        def pmm(params: tuple[jax.Array, ...], x: jax.Array, training: bool, state: tuple, rng: Any):
            return affine_eigenvalues(params, x)[:, :k], state

        return pmm


def affine_eigenvalues(params: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
    """All eigenvalues, ascending, of ``M(x) = hermitian(A0) + sum_i x_i hermitian(A[i])``: [N, n]."""
    a0, a = params
    m = hermitian(a0) + jnp.einsum("np,pij->nij", x, hermitian(a))
    return jnp.linalg.eigvalsh(m)


def hermitian(a: jax.Array) -> jax.Array:
    """The Hermitian matrix a real square array encodes: ``[..., n, n]`` real -> complex.

    The diagonal D and strict lower triangle L give the real part, the strict upper triangle U
    the imaginary part: ``H = D + L + L^T + i (U^T - U)``. Every Hermitian matrix has exactly
    one such encoding.
    """
    lower, upper = jnp.tril(a, -1), jnp.triu(a, 1)
    diagonal = a - lower - upper
    real = diagonal + lower + jnp.swapaxes(lower, -1, -2)
    imag = jnp.swapaxes(upper, -1, -2) - upper
    return jax.lax.complex(real, imag)
