"""Bad input: every mistake a user can type fails from the command line in one line.

Each case runs ``python -m theseus.run +experiment=gpt_tiny ... BAD`` as a user would (logger.mode
left offline, so a W&B run *would* be written if the run started) and checks: a non-zero exit,
stderr exactly one line ``theseus: error: ...`` naming the key or file and the fix, no
traceback, and nothing written (no run or sweep directory, no W&B run, no checkpoint).

Most cases share one subprocess (a driver calling ``theseus.run.main(argv)`` per case, with two
simulated CPU devices); a few are true separate command lines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support import DRIVER, run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

EXPERIMENT = "+experiment=gpt_tiny"
GRPO = ["task=grpo", "data.source=jsonl", "data.path={ws}/prompts.jsonl"]


def _case(name, overrides, *expect, argv_head=(), run_dir=None):
    return pytest.param(name, list(overrides), list(expect), list(argv_head), run_dir, id=name)


# name, overrides, substrings the one line must hold (the key or file, and the fix)
CASES = [
    # misspelt keys
    _case("typo_in_group", ["architectur.n_layers=3"], "'architectur.n_layers'", "did you mean architecture.n_layers"),
    _case("typo_in_leaf", ["architecture.n_layer=3"], "'architecture.n_layer'", "did you mean architecture.n_layers"),
    _case("typo_whole_key", ["optimiser.lr=1e-3"], "'optimiser.lr'", "did you mean optimizer.lr"),
    _case("key_of_another_optimizer", ["optimizer=sgd", "optimizer.b2=0.9"], "optimizer.b2 does not apply",
          "optimizer=adamw, optimizer=lion"),
    # a choice this backend (CPU) cannot run
    _case("cudnn_on_cpu", ["architecture.attention_impl=cudnn"],
          "architecture.attention_impl=cudnn needs an NVIDIA GPU", "architecture.attention_impl=xla"),
    _case("typo_nested_leaf", ["architecture.dtype.parm=float32"], "'architecture.dtype.parm'",
          "did you mean architecture.dtype.param"),
    _case("typo_added_with_plus", ["+trainer.max_stepz=5"], "'trainer.max_stepz'", "did you mean trainer.max_steps"),
    _case("undeclared_top_key", ["+foo=1"], "'foo'", "python -m theseus.config` lists every key"),
    _case("delete_unknown_key", ["~architecture.foo"], "'architecture.foo'", "did you mean"),
    _case("delete_declared_key", ["~architecture.n_layers"], "~architecture.n_layers",
          "set it instead, e.g. architecture.n_layers=VALUE"),
    _case("typo_in_experiment_file", [], "experiments/typo.yaml", "'architecture.n_layer'",
          "did you mean architecture.n_layers", argv_head=["+experiment=typo"]),
    # wrong types
    _case("int_given_abc", ["architecture.n_layers=abc"], "architecture.n_layers", "'abc'",
          "e.g. architecture.n_layers=12"),
    _case("int_given_float", ["architecture.n_layers=2.5"], "architecture.n_layers", "e.g. architecture.n_layers=12"),
    _case("int_given_null", ["architecture.n_layers=null"], "architecture.n_layers", "e.g. architecture.n_layers=12"),
    _case("bool_given_maybe", ["architecture.bias=maybe"], "architecture.bias", "'maybe'",
          "e.g. architecture.bias=true"),
    _case("float_given_x", ["optimizer.lr=x"], "optimizer.lr", "'x'", "e.g. optimizer.lr=0.0003"),
    _case("list_given_int", ["logger.tags=5"], "logger.tags", "e.g. logger.tags=[]"),
    _case("interpolation_to_nothing", ["architecture.n_layers=${nope}"], "architecture.n_layers", "'nope'",
          "an interpolation must name a declared key"),
    # override syntax
    _case("unclosed_list", ["architecture.n_layers=[1,"], "architecture.n_layers=[1,", "write KEY=VALUE"),
    _case("tilde_in_a_path", ["trainer.init_from=~/models/x"], "override 'trainer.init_from=~/models/x'",
          "trainer.init_from=$HOME/models/x"),
    _case("double_equals", ["trainer.max_steps==5"], "trainer.max_steps==5", "write KEY=VALUE"),
    _case("comma_without_multirun", ["optimizer.lr=1e-3,3e-3"], "optimizer.lr=1e-3,3e-3", "--multirun"),
    # values outside their choices or ranges
    _case("logger_mode_loud", ["logger.mode=loud"], "logger.mode must be one of offline, online, disabled"),
    _case("norm_batchnorm", ["architecture.norm=batchnorm"], "architecture.norm must be one of layernorm, rmsnorm"),
    _case("schedule_linear", ["optimizer.schedule=linear"], "optimizer.schedule must be one of constant, cosine, wsd"),
    _case("data_source_web", ["data.source=web"], "data.source must be one of stdlib, text, shards"),
    _case("unknown_model", ["model=gpt3"], "unknown model 'gpt3'", "set model=NAME"),
    _case("unknown_optimizer", ["optimizer=adam"], "unknown optimizer 'adam'",
          "available: adafactor, adamw, lion, muon, sgd"),
    _case("negative_lr", ["optimizer.lr=-1e-3"], "optimizer.lr must be positive", "optimizer.lr=3e-4"),
    _case("negative_rope_theta", ["architecture.positions=rope", "architecture.rope_theta=-1"],
          "architecture.rope_theta must be positive, got -1.0"),
    _case("negative_init_std", ["architecture.init_std=-0.02"], "architecture.init_std must be positive"),
    _case("zero_norm_eps", ["architecture.norm_eps=0"], "architecture.norm_eps must be positive, got 0.0"),
    _case("empty_logger_project", ["logger.project="], "logger.project='' is not a W&B project name",
          "e.g. logger.project=theseus"),
    _case("b1_above_one", ["optimizer.b1=1.5"], "optimizer.b1 must be in [0, 1)", "optimizer.b1=0.9"),
    _case("negative_weight_decay", ["optimizer.weight_decay=-0.1"], "optimizer.weight_decay must be 0 or more"),
    _case("negative_warmup", ["optimizer.warmup_steps=-5"], "optimizer.warmup_steps must be 0 or more"),
    _case("zero_steps", ["trainer.max_steps=0"], "trainer.max_steps must be positive"),
    _case("zero_grad_accum", ["trainer.grad_accum=0"], "trainer.grad_accum must be positive"),
    _case("negative_eval_every", ["trainer.eval_every=-1"], "trainer.eval_every must be 0", "or positive"),
    _case("zero_checkpoints_kept", ["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints must be positive"),
    _case("dropout_above_one", ["architecture.dropout=1.5"], "architecture.dropout must be in [0, 1)"),
    _case("val_fraction_above_one", ["data.val_fraction=1.5"], "data.val_fraction must be in (0, 1)"),
    _case("negative_prefetch", ["data.prefetch=-1"], "data.prefetch must be 0 (no thread) or more, got -1"),
    _case("dpo_exo_pair_unsmoothed", ["task=dpo", "dpo.loss_type=exo_pair"],
          "dpo.loss_type=exo_pair needs dpo.label_smoothing > 0", "e.g. dpo.label_smoothing=0.001"),
    _case("dpo_reference_missing", ["task=dpo", "dpo.reference={ws}/nope"], "dpo.reference={ws}/nope does not exist",
          "give a Hugging Face folder, a theseus run or checkpoint"),
    _case("dpo_of_text", ["task=dpo"], "task=dpo reads preference pairs, not data.source=text", "use data.source=jsonl"),
    _case("dpo_row_without_rejected", ["task=dpo", "data.source=jsonl", "data.path={ws}/pairs.jsonl"],
          "{ws}/pairs.jsonl line 2 has no field 'rejected' (it has 'prompt', 'chosen')",
          "a preference row holds prompt, chosen, rejected"),
    _case("unknown_experiment", [], "unknown experiment 'gpt_huge'", "available:", "gpt_tiny",
          argv_head=["+experiment=gpt_huge"]),
    _case("experiment_file_not_yaml", [], "experiments/broken.yaml does not parse as YAML", "fix the file",
          argv_head=["+experiment=broken"]),
    _case("stray_word_for_an_experiment", [], "unexpected argument 'gpt_tiny'", "did you mean +experiment=gpt_tiny?",
          argv_head=["gpt_tiny"]),
    _case("stray_word_for_an_option", [], "unexpected argument 'lion'", "did you mean optimizer=lion?",
          argv_head=[EXPERIMENT, "lion"]),
    _case("list_given_mapping", ["logger.tags={a: 1}"], "logger.tags", "e.g. logger.tags=[]"),
    _case("optuna_interval_of_unknown_key", ["hydra/sweeper=optuna", "optimizer.lrr=tag(log,interval(1e-4,1e-2))"],
          "'optimizer.lrr'", "did you mean optimizer.lr", argv_head=["-m", EXPERIMENT]),
    _case("optuna_float_interval_for_int_key", ["hydra/sweeper=optuna", "architecture.n_layers=interval(1,4)"],
          "architecture.n_layers", "'1.0'", argv_head=["-m", EXPERIMENT]),
    _case("unknown_sweep", [], "unknown sweep 'nope'", "available: lr", argv_head=["-m", EXPERIMENT, "+sweep=nope"]),
    # impossible shapes
    _case("d_model_not_divisible_by_heads", ["architecture.d_model=65"],
          "architecture.d_model (65) must be divisible by architecture.n_heads (4)"),
    _case("heads_not_divisible_by_kv_heads", ["architecture.n_kv_heads=3"],
          "architecture.n_heads (4) must be divisible by architecture.n_kv_heads (3)"),
    _case("zero_heads", ["architecture.n_heads=0"], "architecture.n_heads must be positive"),
    _case("rope_odd_head_size", ["architecture.positions=rope", "architecture.d_model=12"],
          "architecture.positions=rope needs an even head size"),
    _case("sweep_with_one_impossible_point", ["architecture.n_heads=4,5"],
          "architecture.d_model (64) must be divisible by architecture.n_heads (5)", argv_head=["-m", EXPERIMENT]),
    _case("vocab_smaller_than_tokenizer", ["architecture.vocab_size=100"], "architecture.vocab_size=100",
          "set architecture.vocab_size>=257"),
    # mesh and batch (two devices)
    _case("mesh_needs_more_devices", ["mesh.data=3"], "needs 3 devices but 2 are present",
          "set mesh.data/fsdp/tensor so their product is 2 (-1 takes the rest), or set mesh.cpu_devices=3"),
    _case("mesh_size_zero", ["mesh.data=0"], "mesh.data=0", "must be positive"),
    _case("profile_steps_one_number", ["trainer.profile_steps=[3]"], "trainer.profile_steps must be [START, END]"),
    _case("profile_steps_from_zero", ["trainer.profile_steps=[0,2]"], "with 1 <= START <= END"),
    _case("profile_steps_reversed", ["trainer.profile_steps=[4,2]"], "with 1 <= START <= END"),
    # the driver's earlier cases have started JAX's CPU backend, with two devices
    _case("mesh_cpu_devices_zero", ["mesh.cpu_devices=0"], "mesh.cpu_devices=0", "give a positive number"),
    _case("mesh_cpu_devices_after_start", ["mesh.cpu_devices=3"], "mesh.cpu_devices=3",
          "JAX's CPU backend has started with 2 devices", "set JAX_NUM_CPU_DEVICES=3"),
    _case("mesh_two_free_axes", ["mesh.fsdp=-1"], "mesh.data=-1 and mesh.fsdp=-1", "give the other mesh axes a size"),
    _case("mesh_rule_not_an_axis", ["+mesh.rules.vocab=bogus"], "mesh.rules.vocab='bogus' is not a mesh axis",
          "use one of data, fsdp, expert, tensor"),
    _case("mesh_rule_misspelt_logical_axis", ["+mesh.rules.emebd=fsdp"], "mesh.rules.emebd",
          "no parameter or activation has the logical axis 'emebd'", "did you mean mesh.rules.embed?"),
    _case("batch_not_divisible_by_data_parallel", ["trainer.batch_size=15"], "trainer.batch_size=15",
          "use a multiple of 2"),
    _case("batch_not_divisible_by_accum_x_parallel", ["trainer.grad_accum=3"], "trainer.batch_size=16",
          "trainer.grad_accum=3", "use a multiple of 6"),
    # data and files
    _case("missing_data_path", ["data.path={ws}/nope.txt"], "data.path={ws}/nope.txt does not exist",
          "set data.path to a file, a folder or a glob"),
    _case("text_without_path", ["data.path=null"], "data.source=text needs data.path"),
    _case("empty_corpus_file", ["data.path={ws}/empty.txt"], "data.path={ws}/empty.txt is empty",
          "give data.path some text"),
    _case("folder_without_files", ["data.path={ws}/emptydir"], "data.path={ws}/emptydir matches no text files"),
    _case("corpus_not_utf8", ["data.path={ws}/binary.dat"], "{ws}/binary.dat is not UTF-8 text",
          "convert it to UTF-8"),
    _case("multiple_choice_file_missing",  # a fresh cache: refused before the corpus is prepared
          ["+evaluation.multiple_choice.x={ws}/nope.jsonl", "data.cache_dir={ws}/fresh"],
          "evaluation.multiple_choice.x={ws}/nope.jsonl: no such file"),
    _case("tokenizer_file_does_not_parse", ["data.tokenizer={ws}/bad_tokenizer.json"],
          "{ws}/bad_tokenizer.json does not parse as a Hugging Face tokenizer.json", "point data.tokenizer at"),
    _case("tokenizer_file_missing", ["data.tokenizer={ws}/nope.json"], "{ws}/nope.json does not exist",
          "set data.tokenizer to byte, char, bpe"),
    _case("shard_folder_without_meta", ["data.source=shards", "data.path={ws}/emptydir"],
          "{ws}/emptydir/meta.json is missing"),
    _case("bpe_vocab_too_small", ["data.tokenizer=bpe", "data.bpe_vocab_size=100"], "data.bpe_vocab_size=100",
          "set it above 257"),
    # resume
    _case("resume_points_nowhere", ["trainer.resume={ws}/nowhere"], "trainer.resume={ws}/nowhere is not a checkpoint",
          "give a run directory"),
    _case("resume_never_on_used_dir", ["trainer.resume=never"], "{ws}/used already has checkpoints",
          "choose a new hydra.run.dir", run_dir="{ws}/used"),
    # task=grpo: its reward, its prompts, its batch (GRPO is the prompts of {ws}/prompts.jsonl, rewards_ok.py beside)
    _case("grpo_without_reward", [*GRPO], "task=grpo needs grpo.reward", "e.g. grpo.reward=rewards:correct"),
    _case("grpo_reward_not_importable", [*GRPO, "grpo.reward=no_such_rewards:correct", "grpo.max_completion_length=8"],
          "cannot import 'no_such_rewards', asked for by grpo.reward=no_such_rewards:correct (looked for in {ws}"),
    _case("grpo_reward_not_module_function", [*GRPO, "grpo.reward=correct"], "grpo.reward=correct is not module:function"),
    _case("grpo_batch_not_whole_groups", [*GRPO, "grpo.reward=rewards_ok:correct", "trainer.batch_size=12"],
          "trainer.batch_size=12 counts completions: it must divide by grpo.num_generations=8",
          "trainer.batch_size=8"),
    _case("grpo_completion_too_long", [*GRPO, "grpo.reward=rewards_ok:correct"],
          "no train prompt fits architecture.seq_len + 1 = 65 tokens with grpo.max_completion_length=512",
          "raise architecture.seq_len or lower grpo.max_completion_length"),
    _case("grpo_fitted_tokenizer", [*GRPO, "grpo.reward=rewards_ok:correct", "data.tokenizer=char"],
          "task=grpo samples completions, which a data.tokenizer=char fitted to the prompts may not express"),
    _case("grpo_text_source", ["task=grpo", "grpo.reward=rewards_ok:correct"],
          "task=grpo reads prompt rows, not data.source=text"),
    _case("grpo_row_without_prompt", ["task=grpo", "data.source=jsonl", "data.path={ws}/no_prompts.jsonl",
                                      "grpo.reward=rewards_ok:correct"],
          "{ws}/no_prompts.jsonl line 1 has no field 'prompt' (it has 'question')"),
    # what only the trainer sees: the prepared splits against the context length
    _case("seq_len_longer_than_val_split", ["architecture.seq_len=2048"], "architecture.seq_len"),
    _case("no_validation_split", ["data.val_fraction=0"], "data.val_fraction"),
]

@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace: a small corpus (prepared once), bad files, experiment files in ./experiments."""
    ws = tmp_path_factory.mktemp("bad_input")
    (ws / "corpus.txt").write_text("".join(Path(m.__file__).read_text(encoding="utf-8") for m in (json, pytest)), encoding="utf-8")
    (ws / "empty.txt").touch()
    (ws / "emptydir").mkdir()
    (ws / "binary.dat").write_bytes(b"ok\xff\xfe")
    (ws / "bad_tokenizer.json").write_text("{ this is not json")
    (ws / "pairs.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n')
    (ws / "experiments").mkdir()
    (ws / "experiments" / "typo.yaml").write_text("# @package _global_\narchitecture:\n  n_layer: 2\n")
    (ws / "experiments" / "broken.yaml").write_text("architecture: [\n")
    (ws / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) + "\n"
                                              for i in range(20)))
    (ws / "no_prompts.jsonl").write_text(json.dumps({"question": "1 + 1 ="}) + "\n")
    (ws / "rewards_ok.py").write_text("def correct(prompts, completions, completion_ids, answer, **kwargs):\n"
                                      "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n")
    (ws / "used" / "checkpoints" / "5").mkdir(parents=True)  # a run that trainer.resume=never must not touch
    (ws / "used" / "checkpoints" / "5" / "state").write_text("saved")
    from theseus.data.config import DataConfig
    from theseus.data.prepare import prepare

    prepare(DataConfig(source="text", path=str(ws / "corpus.txt"), cache_dir=str(ws / "cache")))
    return ws


def argv_of(ws: Path, name: str, overrides: list[str], argv_head: list[str], run_dir: str | None) -> list[str]:
    head = argv_head or [EXPERIMENT]
    run_dir = run_dir.replace("{ws}", str(ws)) if run_dir else ws / "runs" / name
    base = ["data.source=text", f"data.path={ws}/corpus.txt", f"data.cache_dir={ws}/cache",
            f"hydra.run.dir={run_dir}",
            f"hydra.sweep.dir={ws / 'sweeps' / name}"]
    return [*head, *base, *(o.replace("{ws}", str(ws)) for o in overrides)]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def results(ws) -> dict:
    """Every case of CASES through theseus.run.main in one process with two CPU devices."""
    cases = {}
    for param in CASES:
        name, overrides, _, argv_head, run_dir = param.values
        cases[name] = ["theseus.run", argv_of(ws, name, overrides, argv_head, run_dir)]
    (ws / "cases.json").write_text(json.dumps(cases))
    before = snapshot(ws / "used")
    proc = run_python("-c", DRIVER, str(ws / "cases.json"), devices=2, cwd=ws, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULTS", 1)[1])
    out["_used_unchanged"] = snapshot(ws / "used") == before
    return out


def assert_refused(code, stderr: str, expect: list[str], ws: Path) -> None:
    assert isinstance(code, int) and code != 0, f"exit {code!r}; stderr: {stderr[-2000:]}"
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n"), f"not one line: {stderr!r}"
    assert lines[0].startswith("theseus: error: "), lines[0]
    for text in expect:
        text = text.replace("{ws}", str(ws))
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"


def assert_nothing_written(ws: Path, name: str) -> None:
    assert not (ws / "runs" / name).exists(), f"{name}: a run directory was created"
    assert not (ws / "sweeps" / name).exists(), f"{name}: a sweep directory was created"
    assert not list(ws.rglob("wandb")), "a W&B run was written"
    assert not [p for p in ws.rglob("checkpoints") if not p.is_relative_to(ws / "used")], "a checkpoint was written"


@pytest.mark.parametrize("name, overrides, expect, argv_head, run_dir", CASES)
def test_bad_input(results, ws, name, overrides, expect, argv_head, run_dir):
    result = results[name]
    assert_refused(result["code"], result["stderr"], expect, ws)
    assert_nothing_written(ws, name)
    if run_dir:
        assert results["_used_unchanged"], "a used run directory was changed"


@pytest.mark.parametrize("overrides", [
    ["mesh.rules={vocab: tensor}"], ["mesh.rules.vocab=tensor"], ["+mesh.rules.mlp=[data,tensor]"],
    ["optimizer.clip_norm=null", "optimizer.warmup_steps=0", "trainer.eval_every=0"],
    ["hydra/launcher=joblib", "hydra.job.chdir=false"],
], ids=["rules_dict", "rules_entry", "rules_added", "edges_of_ranges", "hydra_settings"])
def test_good_input_near_the_bad_still_composes(overrides):
    from theseus.base.mesh import MeshConfig
    from theseus.config import configuration, configure
    from theseus.config.compose import compose
    from theseus.training.optimizer import OptimizerConfig

    cfg = compose([EXPERIMENT, *overrides])
    with configuration(cfg):
        configure(MeshConfig), configure(OptimizerConfig)


def test_corpus_is_large_enough():
    assert len([p for p in CASES if not p.marks]) >= 25


# -- true command lines --------------------------------------------------------------------

COMMAND_LINES = [  # name, overrides, what the line must hold; then argv_head as in CASES
    ("typo_in_leaf", ["trainer.max_step=5"], ["'trainer.max_step'", "did you mean trainer.max_steps"], []),
    ("int_given_abc", ["trainer.batch_size=abc"], ["trainer.batch_size", "'abc'", "e.g. trainer.batch_size=32"], []),
    ("missing_data_path", ["data.path={ws}/nope.txt"], ["data.path={ws}/nope.txt does not exist"], []),
    ("unknown_sweep", [], ["unknown sweep 'nope'", "available: lr"], ["-m", EXPERIMENT, "+sweep=nope"]),
    ("batch_vs_two_devices", ["trainer.batch_size=15"], ["trainer.batch_size=15", "use a multiple of 2"], []),
]


@pytest.mark.parametrize("name, overrides, expect, argv_head", COMMAND_LINES, ids=[c[0] for c in COMMAND_LINES])
def test_command_line(ws, name, overrides, expect, argv_head):
    argv = argv_of(ws, f"cli_{name}", overrides, argv_head, None)
    proc = run_python("-m", "theseus.run", *argv, devices=2, cwd=ws, timeout=300)
    assert proc.stdout == ""
    assert_refused(proc.returncode, proc.stderr, expect, ws)
    assert_nothing_written(ws, f"cli_{name}")


def test_hydra_full_error_shows_the_traceback(ws):
    argv = argv_of(ws, "cli_full_error", ["architecture.n_layers=abc"], [], None)
    proc = run_python("-m", "theseus.run", *argv, env={"HYDRA_FULL_ERROR": "1"}, cwd=ws, timeout=300)
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "theseus.config.errors.ConfigError: architecture.n_layers" in proc.stderr
    assert_nothing_written(ws, "cli_full_error")


def test_a_shape_mistake_fails_before_the_data_is_prepared(ws, tmp_path):
    argv = argv_of(ws, "cli_before_data", ["architecture.d_model=65"], [], None)
    argv = [a.replace(f"data.cache_dir={ws}/cache", f"data.cache_dir={tmp_path}/fresh") for a in argv]
    proc = run_python("-m", "theseus.run", *argv, cwd=ws, timeout=300)
    assert proc.returncode == 2
    assert_refused(proc.returncode, proc.stderr, ["architecture.d_model (65)"], ws)
    assert not (tmp_path / "fresh").exists(), "the corpus was prepared before the config was checked"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
