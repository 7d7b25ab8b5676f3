"""Planning for hardware that is not attached (``trainer.dry_run``, ``mesh.target``): the
target's compile-only devices, whether a step fits their memory, and its predicted time."""
