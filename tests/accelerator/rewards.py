"""The README's GRPO reward (a completion equal to the row's ``answer``), for tests/accelerator's grpo run."""


def correct(prompts, completions, completion_ids, answer, **kwargs):
    return [float(completion[0]["content"].strip() == expected) for completion, expected in zip(completions, answer)]
