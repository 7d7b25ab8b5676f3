"""theseus's SLURM launcher (``hydra/launcher=slurm``, ``launcher.py``); Hydra takes launchers only from here."""
