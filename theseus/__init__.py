"""theseus: a Hydra-driven experiment framework for training JAX/Flax models."""

__version__ = "0.1.0"
