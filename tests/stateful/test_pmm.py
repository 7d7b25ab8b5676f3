"""AffineEigenvaluePMM: eigenvalues of M(x) = M0 + sum_i x_i M_i against numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.stateful import AffineEigenvaluePMM, hermitian

KEY = jax.random.key(0)
RNG = np.random.default_rng(0)


def numpy_hermitian(a: np.ndarray) -> np.ndarray:
    """The documented encoding: diagonal + lower triangle real, upper triangle imaginary."""
    lower, upper = np.tril(a, -1), np.triu(a, 1)
    return np.diag(np.diag(a)) + lower + lower.T + 1j * (upper.T - upper)


def test_hermitian_encoding():
    a = RNG.normal(size=(3, 4, 4)).astype(np.float32)
    h = np.asarray(hermitian(a))
    np.testing.assert_allclose(h, np.conj(np.swapaxes(h, -1, -2)))
    np.testing.assert_allclose(h, [numpy_hermitian(m) for m in a], rtol=1e-6)


def test_every_hermitian_matrix_has_an_encoding():
    b = RNG.normal(size=(4, 4)) + 1j * RNG.normal(size=(4, 4))
    target = b + b.conj().T
    a = np.tril(target.real) - np.triu(target.imag, 1)
    np.testing.assert_allclose(hermitian(jnp.asarray(a, jnp.float32)), target, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("n", "k"), [(5, 1), (5, 3), (4, 4)])
def test_eigenvalues_match_numpy(n, k):
    pmm = AffineEigenvaluePMM(n=n, k=k)
    pmm.compile(KEY, (3,))
    a0, a = (np.asarray(p) for p in pmm.get_params())
    x = RNG.normal(size=(8, 3)).astype(np.float32)
    m = numpy_hermitian(a0) + np.einsum("np,pij->nij", x, [numpy_hermitian(ai) for ai in a])
    expected = np.linalg.eigvalsh(m)[:, :k]
    y, state = pmm(x)
    assert y.shape == (8, k) and state == ()
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_diagonal_matrices_give_sorted_affine_eigenvalues():
    pmm = AffineEigenvaluePMM(n=3, k=2)
    pmm.set_params((jnp.diag(jnp.array([1.0, 2.0, 3.0])), jnp.diag(jnp.array([1.0, 0.0, -1.0]))[None]))
    x = jnp.array([[0.0], [0.75], [3.0]])
    # eigenvalues 1 + x, 2, 3 - x, smallest two
    np.testing.assert_allclose(pmm(x)[0], [[1.0, 2.0], [1.75, 2.0], [0.0, 2.0]], atol=1e-6)


@pytest.mark.slow
def test_input_gradient_is_hellmann_feynman():
    """d lambda_0 / d x_i = v0^H M_i v0, v0 the lowest eigenvector (from numpy)."""
    pmm = AffineEigenvaluePMM(n=4, k=1)
    pmm.compile(KEY, (2,))
    a0, a = (np.asarray(p, np.float64) for p in pmm.get_params())
    x = np.array([0.3, -0.7])
    forward = pmm._get_callable()
    grad = jax.grad(lambda x: forward(pmm.get_params(), x[None], True, (), None)[0][0, 0])(jnp.asarray(x, jnp.float32))
    ms = [numpy_hermitian(ai) for ai in a]
    _, vectors = np.linalg.eigh(numpy_hermitian(a0) + sum(xi * mi for xi, mi in zip(x, ms)))
    v0 = vectors[:, 0]
    np.testing.assert_allclose(grad, [np.real(v0.conj() @ mi @ v0) for mi in ms], rtol=1e-3, atol=1e-4)


def test_parameter_gradients_are_finite():
    pmm = AffineEigenvaluePMM(n=4, k=2)
    pmm.compile(KEY, (3,))
    forward, x = pmm._get_callable(), RNG.normal(size=(5, 3)).astype(np.float32)
    grads = jax.jit(jax.grad(lambda p: forward(p, x, True, (), None)[0].sum()))(pmm.get_params())
    assert [g.shape for g in grads] == [(4, 4), (3, 4, 4)]
    assert all(np.isfinite(g).all() and np.abs(g).sum() > 0 for g in grads)


def test_shapes_and_counts():
    pmm = AffineEigenvaluePMM(n=4, k=2)
    assert pmm.get_output_shape((6,)) == (2,)
    pmm.compile(KEY, (6,))
    assert pmm.get_num_trainable_floats() == 7 * 16  # (p + 1) n^2: a Hermitian matrix's degrees of freedom


def test_errors():
    with pytest.raises(ValueError, match="AffineEigenvaluePMM needs 1 <= k <= n, got n=2, k=3"):
        AffineEigenvaluePMM(n=2, k=3)
    pmm = AffineEigenvaluePMM(n=2, k=1)
    pmm.set_hyperparameters({"k": 5})
    with pytest.raises(ValueError, match="needs 1 <= k <= n, got n=2, k=5"):
        pmm.compile(KEY, (3,))
    with pytest.raises(ValueError, match=r"expects input shape \(features,\), got \(3, 2\)"):
        AffineEigenvaluePMM().compile(KEY, (3, 2))
    with pytest.raises(ValueError, match=r"takes params \(A0 \[2, 2\], A \[p, 2, 2\]\), got shapes \[\(2, 2\), \(3, 2\)\]"):
        AffineEigenvaluePMM(n=2).set_params((jnp.ones((2, 2)), jnp.ones((3, 2))))
    with pytest.raises(ValueError, match="params are real arrays"):
        AffineEigenvaluePMM(n=2).set_params((jnp.ones((2, 2), jnp.complex64), jnp.ones((3, 2, 2))))
