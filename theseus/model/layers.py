"""Layers: the building blocks of theseus's language models.

Every layer is a theseus Module: its hyperparameters are config fields, its parameters carry
logical axes, and ``flops(seq)`` counts forward + backward FLOPs of one sequence, with a
matmul of an [m, k] by a [k, n] costing 2mkn forward and twice that backward (6 per
parameter per position).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import EMBED, MLP as MLP_AXIS
from theseus.config import field
from theseus.model.module import Module


class MLP(Module):
    """Position-wise feed-forward: ``x: [batch, seq, d_model] -> [batch, seq, d_model]``.

    GELU: ``W_out gelu(W_in x)``; SwiGLU: ``W_out (silu(W_gate x) * W_in x)``.
    """

    d_model: int = field("architecture/d_model", default=768, help="width of the residual stream")
    d_ff: int | None = field("architecture/d_ff", default=None, help="hidden width of the MLP; None: 4 x d_model")
    activation: str = field("architecture/activation", default="gelu", choices=("gelu", "swiglu"), help="MLP nonlinearity")
    bias: bool = field("architecture/bias", default=True, help="add biases to linear layers")
    dropout: float = field("architecture/dropout", default=0.0, help="dropout rate (training only)")
    init_std: float = field("architecture/init_std", default=0.02, help="stddev of the normal initialiser")

    @property
    def hidden(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def n_in(self) -> int:
        """Input projections: 2 for SwiGLU (gate and value), 1 for GELU."""
        return 2 if self.activation == "swiglu" else 1

    def setup(self):
        init = nn.initializers.normal(self.init_std)
        shape_in = (self.n_in, self.d_model, self.hidden)
        self.w_in = self.param("w_in", nn.with_logical_partitioning(init, (None, EMBED, MLP_AXIS)), shape_in, self._param_dtype)
        self.w_out = self.param("w_out", nn.with_logical_partitioning(init, (MLP_AXIS, EMBED)), (self.hidden, self.d_model), self._param_dtype)
        if self.bias:
            zeros = nn.initializers.zeros
            self.b_in = self.param("b_in", nn.with_logical_partitioning(zeros, (None, MLP_AXIS)), (self.n_in, self.hidden), self._param_dtype)
            self.b_out = self.param("b_out", nn.with_logical_partitioning(zeros, (EMBED,)), (self.d_model,), self._param_dtype)
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        dtype = self._activation_dtype
        h = jnp.einsum("bsd,ndf->nbsf", x.astype(dtype), self.w_in.astype(dtype))
        if self.bias:
            h = h + self.b_in.astype(dtype)[:, None, None, :]
        h = jax.nn.silu(h[0]) * h[1] if self.activation == "swiglu" else jax.nn.gelu(h[0], approximate=True)
        y = h @ self.w_out.astype(dtype)
        if self.bias:
            y = y + self.b_out.astype(dtype)
        return self.drop(y, deterministic=deterministic)

    def flops(self, seq: int) -> int:
        return 6 * (self.n_in + 1) * self.d_model * self.hidden * seq
