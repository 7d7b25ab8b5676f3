"""Stateful modules: BaseModules that own their parameters (see theseus.model.base).

    from theseus.model.stateful import Model, Linear, ReLU, AffineEigenvaluePMM
    model = Model([AffineEigenvaluePMM(n=6, k=2), Linear(width=1)])
"""

from theseus.model.base import BaseModule, Model
from theseus.model.stateful.adapter import FlaxAdapter
from theseus.model.stateful.elementwise import GELU, Elementwise, ReLU, Sigmoid, Tanh
from theseus.model.stateful.flatten import Flatten
from theseus.model.stateful.linear import Linear
from theseus.model.stateful.params import Parameterless, Parametric
from theseus.model.stateful.pmm import AffineEigenvaluePMM, hermitian

__all__ = [
    "GELU",
    "AffineEigenvaluePMM",
    "BaseModule",
    "Elementwise",
    "Flatten",
    "FlaxAdapter",
    "Linear",
    "Model",
    "Parameterless",
    "Parametric",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "hermitian",
]
