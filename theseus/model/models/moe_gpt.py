"""MoEGPT: a GPT whose feed-forward is a mixture of experts every ``architecture.moe.every``-th
layer (``model=moe``; the keys ``architecture.moe.*``, see ``theseus.model.moe``).

    with configuration(cfg):
        model = configure(MoEGPT, vocab_size=256)
    logits, sown = model.apply({"params": params}, tokens, mutable=["auxiliary"])  # sown: routing statistics
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from theseus.config import POSITIVE, ConfigError, field
from theseus.model import architecture
from theseus.model.layers import Block
from theseus.model.models.gpt import GPT
from theseus.model.moe import ROUTE_BIAS, MoEBlock, route_bias_rule
from theseus.model.module import Module, Rule


class MoEGPT(GPT):
    """GPT with ``moe_block_cls`` at layers ``i`` where ``(i + 1) % every == 0`` (Qwen2-MoE's
    ``decoder_sparse_step``) and ``dense_block_cls`` elsewhere; ``every=1``: every layer."""

    block_cls: ClassVar[type[Module]] = MoEBlock
    moe_block_cls: ClassVar[type[Module]] = MoEBlock
    dense_block_cls: ClassVar[type[Module]] = Block

    every: int = field("architecture.moe.every", default=1, check=POSITIVE,
                       help="a mixture-of-experts feed-forward every N-th layer (layers N-1, 2N-1, ...), dense between")
    bias_update_rate: float = architecture.moe_bias_update_rate()

    def __post_init__(self):
        super().__post_init__()  # each field within its declared range
        if self.every > self.n_layers:
            raise ConfigError(f"architecture.moe.every={self.every} puts an expert layer every {self.every} layers, "
                              f"but architecture.n_layers={self.n_layers}: no layer would be one; set "
                              f"architecture.moe.every to at most {self.n_layers}")
        if self.every > 1 and self.scan_layers:
            raise ConfigError(f"architecture.scan_layers=true repeats one block, but architecture.moe.every="
                              f"{self.every} mixes dense and MoE layers: set architecture.moe.every=1 or "
                              f"architecture.scan_layers=false")

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), cls.moe_block_cls, cls.dense_block_cls]

    def outside_optimizer(self) -> Mapping[str, Rule]:
        """Bias-balanced routing's biases, moved by ``bias_update_rate`` against each expert's load."""
        return {ROUTE_BIAS: route_bias_rule(self.bias_update_rate)} if self.bias_update_rate else {}

    def layer_cls(self, index: int) -> type[Module]:
        return self.moe_block_cls if (index + 1) % self.every == 0 else self.dense_block_cls
