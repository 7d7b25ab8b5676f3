# myproj/mymodels.py: the README's example, as it shows it (tests copy it into a project folder)
from theseus.config import field, register
from theseus.model.layers import MLP, Block
from theseus.model.models.gpt import GPT


class ScaledMLP(MLP):
    ff_scale: float = field("architecture.ff_scale", default=1.0, help="multiplier on the MLP output")

    def __call__(self, x, deterministic=True):  # x: [batch, seq, d_model]
        return self.ff_scale * super().__call__(x, deterministic=deterministic)


class ScaledBlock(Block):
    mlp_cls = ScaledMLP       # Block builds its MLP from this class attribute


@register("model", "scaled_gpt")
class ScaledGPT(GPT):
    block_cls = ScaledBlock   # GPT builds its blocks from this one
