"""Configuration: hyperparameters declared once as ``field()``s, the Hydra schema derived.

    from theseus.config import field, configure, configuration
"""

from theseus.config.context import Snapshot, active, configuration, configure, configured
from theseus.config.errors import ConfigError
from theseus.config.fields import (
    FRACTION,
    MISSING,
    NON_NEGATIVE,
    PLANNING,
    POSITIVE,
    RUNTIME,
    SEED,
    Configurable,
    FieldSpec,
    Range,
    field,
    gather,
    specs,
)
from theseus.config.registry import register
from theseus.config.schema import Schema, derive, keys_with, schema_of, structured

__all__ = [
    "FRACTION",
    "MISSING",
    "NON_NEGATIVE",
    "PLANNING",
    "POSITIVE",
    "RUNTIME",
    "SEED",
    "ConfigError",
    "Configurable",
    "FieldSpec",
    "Schema",
    "Range",
    "Snapshot",
    "active",
    "configuration",
    "configure",
    "configured",
    "derive",
    "field",
    "gather",
    "keys_with",
    "register",
    "schema_of",
    "specs",
    "structured",
]
