"""Logger settings: Weights & Biases mode and naming."""

from __future__ import annotations

import dataclasses

from theseus.config import Configurable, field, register


@register("logger", "wandb")
@dataclasses.dataclass(frozen=True)
class LoggerConfig(Configurable):
    mode: str = field("logger/mode", default="offline", choices=("offline", "online", "disabled"),
                      help="offline: local W&B run (no account); online: sync live; disabled: no W&B")
    project: str = field("logger/project", default="theseus", help="W&B project")
    name: str | None = field("logger/name", default=None, help="run name; unset: W&B picks one")
    tags: list[str] = field("logger/tags", default=[], help="W&B tags")
