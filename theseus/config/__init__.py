"""Configuration: hyperparameters declared once as ``field()``s, the Hydra schema derived.

    from theseus.config import field, configure, configuration
"""

from theseus.config.context import Snapshot, active, configuration, configure
from theseus.config.errors import ConfigError
from theseus.config.fields import MISSING, Configurable, FieldSpec, field, gather, specs
from theseus.config.registry import register
from theseus.config.schema import Schema, derive, schema_of, structured

__all__ = [
    "MISSING",
    "ConfigError",
    "Configurable",
    "FieldSpec",
    "Schema",
    "Snapshot",
    "active",
    "configuration",
    "configure",
    "derive",
    "field",
    "gather",
    "register",
    "schema_of",
    "specs",
    "structured",
]
