"""Local lm-eval tasks over local JSONL files (nothing downloads): a multiple-choice task whose
contexts end in whitespace, mid-word and in non-ASCII text, a perplexity task of documents longer
than the window, a generation task with stop sequences, and a log-likelihood task of empty
contexts; in each, texts longer than a window of 64 tokens, and one beginning with a BOS's text."""

from __future__ import annotations

import json
from pathlib import Path

CODE = "def evaluate(params, batch):\n    return model.apply(params, batch)\n"
LONG = CODE * 3  # over 64 tokens: cut on the left to fit the window
MC = [  # contexts ending in a space, a newline, mid-word; choices of 1-2-byte characters
    {"context": "The cat sat on the ", "choices": ["mat.", "moon", "hat and coat"], "label": 0},
    {"context": "def f(x):\n    ret", "choices": ["urn x", "ain", "ry"], "label": 0},
    {"context": "1 2 3\n", "choices": ["4 5", "five", "six seven"], "label": 1},
    {"context": "café au ", "choices": ["lait", "thé", "eau"], "label": 2},
    {"context": "class A:\n    pa", "choices": ["ss", "rt", "use it"], "label": 0},
    {"context": "hello wor", "choices": ["ld", "m", "k ethic"], "label": 0},
    {"context": "import numpy as ", "choices": ["np", "pd", "numpy"], "label": 0},
    {"context": "x = [1, 2,  ", "choices": ["3]", "4]", "]"], "label": 1},
    {"context": LONG + "def step(params, batch):\n    ret", "choices": ["urn model.apply(params, batch)", "ain", "ry"],
     "label": 0},
    {"context": "<s>import numpy as ", "choices": ["np", "pd"], "label": 0},  # a Llama tokenizer's BOS, as text
]
DOCS = [CODE * 4, "A short document.", "naïve café " * 12]
GENERATE = [{"prompt": "def f(x):\n    return", "stop": "\n"}, {"prompt": "The cat", "stop": "."},
            {"prompt": "import", "stop": " "}, {"prompt": LONG + "def f(x):\n    return", "stop": "\n"}]
LOGLIKELIHOOD = [  # an empty context is the prefix token (a continuation's own first token, when it is that)
    {"context": "", "continuation": "def g(y):\n    return y + 1"},
    {"context": "", "continuation": "<|endoftext|>import numpy as np"},
    {"context": "<s>The cat sat on the", "continuation": " mat."},
    {"context": LONG, "continuation": "def step(params, batch):\n    return model.apply(params, batch)"},
]


def write_tasks(folder: Path) -> Path:
    """Task YAMLs ``theseus_mc``, ``theseus_ppl``, ``theseus_gen`` and ``theseus_ll`` under
    ``folder``, over JSONL files beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"mc": MC, "ppl": [{"text": text} for text in DOCS], "gen": GENERATE, "ll": LOGLIKELIHOOD}
    for name, rows in files.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\ntest_split: test\n"
    (folder / "mc.yaml").write_text(
        "task: theseus_mc\n" + common.format(path=folder / "mc.jsonl") +
        "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: label\ntarget_delimiter: ''\nmetric_list:\n"
        "  - metric: acc\n  - metric: acc_norm\n  - metric: acc_bytes\n")
    (folder / "ppl.yaml").write_text(
        "task: theseus_ppl\n" + common.format(path=folder / "ppl.jsonl") +
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n"
        "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    (folder / "gen.yaml").write_text(
        "task: theseus_gen\n" + common.format(path=folder / "gen.jsonl") +
        "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{stop}}'\n"
        "generation_kwargs:\n  until: ['\\n\\n', '}}']\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    (folder / "ll.yaml").write_text(
        "task: theseus_ll\n" + common.format(path=folder / "ll.jsonl") +
        "output_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{continuation}}'\n"
        "target_delimiter: ''\nmetric_list:\n  - metric: acc\n")  # acc: whether the continuation is the greedy one
    return folder
