"""``python -m theseus.sample RUN_DIR [--prompt TEXT]``: continue a prompt with a trained model.

Loads the run's config (``RUN_DIR/.hydra/config.yaml``), its tokenizer and the parameters of
its newest readable checkpoint (or ``--step``), and prints the generated text.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh
from omegaconf import DictConfig, OmegaConf

from theseus.base.axis import ShardingPlan
from theseus.base.mesh import MeshConfig, make_mesh
from theseus.config import ConfigError, configuration, configure, registry
from theseus.config.registry import model_class
from theseus.data.config import DataConfig
from theseus.data.dataset import Dataset, open_dataset
from theseus.data.mixture import Mixture
from theseus.interop.init_from import apply_init_from
from theseus.model.generate import sample_text
from theseus.training.checkpoint import Checkpointer
from theseus.training.optimizer import make_optimizer, optimizer_class
from theseus.training.state import sharded_init
from theseus.training.trainer import with_vocab


@dataclasses.dataclass(frozen=True)
class Restored:
    """A run directory's checkpoint, ready to use on one device."""

    cfg: DictConfig  # the run's config, ``architecture.vocab_size`` resolved, with any overrides
    data: Dataset | Mixture  # its corpus (the tokenizer, the validation splits)
    model: nn.Module
    params: Any  # on the one device of ``mesh``
    mesh: Mesh
    step: int


def saved_config(run_dir: Path, overrides: DictConfig | None = None) -> DictConfig:
    """The config a run directory's job ran (``.hydra/config.yaml``) merged with ``overrides``;
    ConfigError when ``run_dir`` is not a run directory. Registers the modules it may name."""
    config_file = run_dir / ".hydra" / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no .hydra/config.yaml): give the folder a run wrote")
    registry.load()
    return OmegaConf.merge(OmegaConf.load(config_file), overrides or {})


def checkpoint(run_dir: Path, step: int | None, target: Any) -> tuple[Any, int]:
    """``(state, step)``: a run directory's checkpoint (the newest readable one, or ``step``)
    restored onto ``target`` (the state's layout); ConfigError when there is none."""
    checkpoints = Checkpointer(run_dir / "checkpoints", requested_step=step)
    if step is not None and step not in checkpoints.steps():
        raise ConfigError(f"{run_dir / 'checkpoints'} has no checkpoint of step {step}: saved steps are "
                          f"{', '.join(map(str, checkpoints.steps())) or 'none'}")
    restored = checkpoints.restore(target, step=step, report=lambda line: print(line, file=sys.stderr))
    if restored is None:
        raise ConfigError(f"{run_dir / 'checkpoints'} holds no readable checkpoint: train first")
    return restored[0], restored[3]


def restore(run_dir: Path, step: int | None = None, overrides: DictConfig | None = None) -> Restored:
    """The model, parameters and data of a run directory's checkpoint (the newest readable one,
    or ``step``), its saved config merged with ``overrides``, on one device; ConfigError when
    there is none."""
    # a run from a Hugging Face folder (trainer.init_from) takes that folder's architecture
    cfg = apply_init_from(saved_config(run_dir, overrides))
    with configuration(cfg):
        dataset = open_dataset(configure(DataConfig))
    cfg = with_vocab(cfg, dataset.vocab_size)
    with configuration(cfg):
        model = configure(model_class(cfg))
        tx, _ = make_optimizer(configure(optimizer_class(cfg)), 1)
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    _, target, _ = sharded_init(model, tx, model.seq_len, 0, ShardingPlan(), mesh)
    state, at = checkpoint(run_dir, step, target)
    return Restored(cfg, dataset, model, state.params, mesh, at)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m theseus.sample", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    args = parser.parse_args(argv)
    try:
        run = restore(args.run_dir, args.step)
        model, params, tokenizer = run.model, run.params, run.data.tokenizer
        if not args.prompt or len(tokenizer.encode(args.prompt)) + args.max_new_tokens > model.seq_len:
            raise ConfigError(f"--prompt plus --max-new-tokens must be between 1 and architecture.seq_len "
                              f"({model.seq_len}) tokens")
        text = sample_text(model, params, args.prompt, tokenizer.encode, tokenizer.decode, args.max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k, rng=jax.random.key(args.seed),
                           vocab_size=tokenizer.vocab_size)
    except (ConfigError, ValueError) as exc:  # a bad argument (ValueError: generate's own checks)
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    print(args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
