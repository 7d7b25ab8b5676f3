"""The stateful API: BaseModules that own their parameters (``theseus.stateful.base``), a
``Model`` that chains them, its layers, ``fit`` and the PMM. Built on ``theseus.model``,
never imported by it.

    from theseus.stateful import Model, Linear, ReLU, AffineEigenvaluePMM
    model = Model([AffineEigenvaluePMM(n=6, k=2), Linear(width=1)])
"""

from theseus.stateful.adapter import FlaxAdapter
from theseus.stateful.base import BaseModule
from theseus.stateful.elementwise import GELU, Elementwise, ReLU, Sigmoid, Tanh
from theseus.stateful.flatten import Flatten
from theseus.stateful.linear import Linear
from theseus.stateful.model import Model
from theseus.stateful.params import Parameterless, Parametric
from theseus.stateful.pmm import AffineEigenvaluePMM, hermitian

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
