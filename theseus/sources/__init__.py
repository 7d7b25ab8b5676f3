"""Where a model comes from: a Hugging Face folder (or a model id in the local hub cache), a GGUF
file, a theseus run or checkpoint. Each kind is a class that answers what the rest of theseus
asks of a model: its architecture, tokenizer and tensors, how a run starts from it, its frozen
base, its weights on a layout.

    source = parse_source("~/models/my-llama", key="trainer.init_from")   # an HFFolder
    values = source.init_from_values(cfg)       # the architecture and tokenizer it determines
    params = source.load_params(arch, target)   # its weights on their shards

model_source.py   the base every kind derives, and what it answers
parse.py          a name, as given, to its kind (hub_cache.py: a model id found offline)
imported.py       HFFolder and GGUFFile: weights from outside theseus
theseus_run.py    TheseusRun: a run or checkpoint theseus wrote
in_config.py      the source a composed config names (``trainer.init_from``), and what it determines there
weights.py        ``load_params``: any source's weights by its path
checkpoint_folders.py, checkpoint_reader.py, stacked_inputs.py, frozen_base.py
                  theseus's own checkpoints read (folders; Orbax; an older layout; a LoRA run's base)
"""

from theseus.sources.imported import GGUFFile, HFFolder, ImportedWeights
from theseus.sources.model_source import ModelSource, StartFrom
from theseus.sources.parse import parse_source
from theseus.sources.theseus_run import TheseusRun
from theseus.sources.weights import load_params

__all__ = ["GGUFFile", "HFFolder", "ImportedWeights", "ModelSource", "StartFrom", "TheseusRun", "load_params",
           "parse_source"]
