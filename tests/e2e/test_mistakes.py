"""The commands around ``theseus.run``, and its newest keys, hardened as it is: every mistake of
this corpus exits 2 with one line ``theseus: error: ...`` naming the argument, key or file and
the fix, before any work, and changes nothing in the user's folder (no file created, none changed).

One 2-step gpt_tiny run is trained once (``run/``); copies of it are damaged for the cases that
need it (no checkpoints, a corrupt ``.hydra/config.yaml``). The cases share one subprocess, a
driver calling each command's ``main(argv)`` as ``python -m`` would (``theseus.run``'s with
Hydra's start refused, as in test_bad_input.py; ``theseus.runs.load`` raising its error), with
the user's folder listed before and after each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import DRIVER, run_python

pytestmark = pytest.mark.slow  # end to end: a real run and a subprocess

DATA = ["data.source=text", "data.path=corpus.txt", "data.cache_dir=cache"]
RUN = ["+experiment=gpt_tiny", *DATA, "logger.mode=offline", "hydra.run.dir=refused", "hydra.sweep.dir=refused-sweep"]


def case(name, module, argv, *expect):
    return pytest.param(module, list(argv), list(expect), id=name)


CASES = [
    # theseus.sample
    case("sample_no_path", "theseus.sample", [], "the following arguments are required: path"),
    case("sample_path_missing", "theseus.sample", ["nowhere"], "nowhere is no local path",
         "not in the Hugging Face cache", "give a Hugging Face folder, a theseus run or checkpoint"),
    case("sample_negative_temperature", "theseus.sample", ["run", "--temperature", "-1"], "--temperature",
         "must be 0 or more, got '-1'"),
    case("sample_temperature_text", "theseus.sample", ["run", "--temperature", "hot"], "--temperature", "'hot'"),
    case("sample_top_k_zero", "theseus.sample", ["run", "--top-k", "0"], "--top-k", "at least 1"),
    case("sample_top_k_over_vocabulary", "theseus.sample", ["run", "--top-k", "100000"],
         "top_k must be between 1 and the vocabulary size"),
    case("sample_no_new_tokens", "theseus.sample", ["run", "--max-new-tokens", "0"], "--max-new-tokens", "at least 1"),
    case("sample_step_not_saved", "theseus.sample", ["run", "--step", "7"], "has no checkpoint of step 7",
         "saved steps are 2"),
    case("sample_negative_step", "theseus.sample", ["run", "--step", "-2"], "--step", "at least 0"),
    case("sample_empty_prompt", "theseus.sample", ["run", "--prompt", ""], "--prompt must hold at least one token"),
    case("sample_misspelt_flag", "theseus.sample", ["run", "--temprature", "1"], "unrecognized arguments: --temprature 1"),
    case("sample_run_without_checkpoints", "theseus.sample", ["untrained"], "untrained holds no checkpoint",
         "train it first"),
    case("sample_corrupt_config", "theseus.sample", ["corrupt"], "corrupt/.hydra/config.yaml is not valid YAML",
         "repair it"),
    case("sample_config_not_a_mapping", "theseus.sample", ["listed"], "listed/.hydra/config.yaml holds list",
         "repair it"),
    case("sample_hf_folder_without_tokenizer", "theseus.sample", ["hf_no_tokenizer"],
         "hf_no_tokenizer has no tokenizer.json", "save the model's tokenizer"),
    case("sample_hf_step", "theseus.sample", ["exported", "--step", "2"], "--step 2", "Hugging Face folder"),
    # theseus.export
    case("export_arguments_swapped", "theseus.export", ["exported", "run"], "run is a run directory",
         "the arguments are SOURCE OUT_DIR"),
    case("export_into_another_model", "theseus.export", ["run", "exported"], "exported exists and is not an empty folder",
         "export into a new folder"),
    case("export_into_a_file", "theseus.export", ["run", "corpus.txt"], "corpus.txt exists and is not an empty folder"),
    case("export_inside_the_run", "theseus.export", ["run", "run/hf"], "run/hf is inside run",
         "a folder outside it"),
    case("export_run_without_checkpoints", "theseus.export", ["untrained", "out"], "untrained holds no checkpoint"),
    case("export_step_not_saved", "theseus.export", ["run", "out", "--step", "9"], "has no checkpoint of step 9"),
    case("export_corrupt_config", "theseus.export", ["corrupt", "out"], "corrupt/.hydra/config.yaml is not valid YAML"),
    case("export_source_missing", "theseus.export", ["nowhere", "out"], "nowhere is no local path"),
    case("export_one_argument", "theseus.export", ["run"], "the following arguments are required: out_dir"),
    case("export_step_text", "theseus.export", ["run", "out", "--step", "last"], "--step", "'last'"),
    # theseus.report
    case("report_port_too_large", "theseus.report.__main__", ["run", "--serve", "--port", "80500"], "--port",
         "a port from 1 to 65535", "'80500'"),
    case("report_port_negative", "theseus.report.__main__", ["run", "--serve", "--port", "-1"], "--port", "'-1'"),
    case("report_port_text", "theseus.report.__main__", ["run", "--serve", "--port", "http"], "--port", "'http'"),
    case("report_port_without_serve", "theseus.report.__main__", ["run", "--port", "9000"], "--port 9000 is the port of --serve",
         "add --serve"),
    case("report_output_is_a_folder", "theseus.report.__main__", ["run", "-o", "cache"], "-o cache is a folder",
         "-o cache/report.html"),
    case("report_output_folder_missing", "theseus.report.__main__", ["run", "-o", "pages/report.html"],
         "-o pages/report.html: its folder", "does not exist"),
    case("report_output_and_serve", "theseus.report.__main__", ["run", "-o", "page.html", "--serve"], "give one of them"),
    case("report_path_missing", "theseus.report.__main__", ["nowhere"], "nowhere does not exist"),
    case("report_folder_without_runs", "theseus.report.__main__", ["cache"], "cache is neither a run directory"),
    case("report_corrupt_config", "theseus.report.__main__", ["corrupt"], "corrupt/.hydra/config.yaml is not valid YAML"),
    case("report_no_path", "theseus.report.__main__", [], "the following arguments are required: PATH"),
    # theseus.evaluate
    case("evaluate_path_missing", "theseus.evaluate", ["nowhere"], "nowhere is no local path"),
    case("evaluate_run_without_checkpoints", "theseus.evaluate", ["untrained"], "untrained"),
    case("evaluate_corrupt_config", "theseus.evaluate", ["corrupt"], "corrupt/.hydra/config.yaml is not valid YAML"),
    case("evaluate_model_key", "theseus.evaluate", ["run", "architecture.n_layers=3"], "architecture.n_layers=3",
         "trainer.eval_batches=N"),
    case("evaluate_misspelt_key", "theseus.evaluate", ["run", "evaluation.multiple_chioce.x=a.jsonl"],
         "evaluation.multiple_chioce", "did you mean evaluation.multiple_choice"),
    # theseus.runs.load (a Python API: its error, one line)
    case("runs_load_missing", "theseus.runs", ["nowhere"], "nowhere is neither a run directory"),
    case("runs_load_corrupt_config", "theseus.runs", ["corrupt"], "corrupt/.hydra/config.yaml is not valid YAML"),
    case("runs_load_corrupt_overrides", "theseus.runs", ["bad_overrides"],
         "bad_overrides/.hydra/overrides.yaml holds dict, not the list a run writes"),
    case("runs_load_folder_without_runs", "theseus.runs", ["cache"], "cache is neither a run directory"),
    # theseus.launch
    case("launch_no_processes", "theseus.launch", ["--", *RUN], "the following arguments are required: --processes"),
    case("launch_zero_processes", "theseus.launch", ["--processes", "0", "--", *RUN], "--processes", "at least 1"),
    case("launch_zero_devices", "theseus.launch", ["--processes", "2", "--devices-per-process", "0", "--", *RUN],
         "--devices-per-process", "at least 1"),
    case("launch_processes_text", "theseus.launch", ["--processes", "two", "--", *RUN], "--processes", "'two'"),
    # theseus.run: the newest keys
    case("target_unknown_chip", "theseus.run", [*RUN, "mesh.target=tpu:v9-8", "trainer.dry_run=true"],
         "mesh.target=tpu:v9-8"),
    case("target_not_a_target", "theseus.run", [*RUN, "mesh.target=h100", "trainer.dry_run=true"], "mesh.target=h100"),
    case("plan_file_without_dry_run", "theseus.run", [*RUN, "trainer.plan_file=plan.jsonl"],
         "trainer.plan_file=plan.jsonl is written by a dry run", "add trainer.dry_run=true"),
    case("plan_file_folder_missing", "theseus.run", [*RUN, "trainer.dry_run=true", "trainer.plan_file=plans/p.jsonl"],
         "trainer.plan_file=plans/p.jsonl: its folder does not exist"),
    case("moe_every_beyond_the_layers", "theseus.run", [*RUN, "model=moe", "architecture.moe.every=3"],
         "architecture.moe.every=3", "architecture.n_layers=2", "at most 2"),
    case("moe_every_zero", "theseus.run", [*RUN, "model=moe", "architecture.moe.every=0"],
         "architecture.moe.every must be positive"),
    case("moe_top_k_beyond_experts", "theseus.run", [*RUN, "model=moe", "architecture.moe.top_k=9"],
         "architecture.moe.top_k"),
    case("moe_no_experts", "theseus.run", [*RUN, "model=moe", "architecture.moe.n_experts=0"],
         "architecture.moe.n_experts"),
    case("moe_key_on_a_dense_model", "theseus.run", [*RUN, "architecture.moe.every=2"],
         "architecture.moe is a key of model=moe", "choose model=moe or drop the key"),
    case("expert_axis_beyond_the_devices", "theseus.run", [*RUN, "model=moe", "mesh.expert=4"], "expert=4",
         "does not divide the 2 devices", "fix mesh.*"),
    case("lm_eval_include_missing", "theseus.run", [*RUN, "evaluation.lm_eval=[mytask]",
                                                    "evaluation.lm_eval_include=tasks_nowhere"], "tasks_nowhere"),
    case("lm_eval_fewshot_negative", "theseus.run", [*RUN, "evaluation.lm_eval=[mytask]",
                                                     "evaluation.lm_eval_fewshot=-1"], "evaluation.lm_eval_fewshot"),
    case("lm_eval_limit_zero", "theseus.run", [*RUN, "evaluation.lm_eval=[mytask]", "evaluation.lm_eval_limit=0"],
         "evaluation.lm_eval_limit"),
    case("lm_eval_unknown_task", "theseus.run", [*RUN, "evaluation.lm_eval=[no_such_task]"],
         "unknown lm-eval task 'no_such_task'"),
    case("lm_eval_hub_task_offline", "theseus.run", [*RUN, "evaluation.lm_eval=[hellaswag]"],
         "evaluation.lm_eval task 'hellaswag': its data does not load", "Couldn't reach"),
    case("lm_eval_task_data_missing", "theseus.run", [*RUN, "evaluation.lm_eval=[my_task]",
                                                      "evaluation.lm_eval_include=my_tasks"],
         "evaluation.lm_eval task 'my_task': its data does not load", "give a task YAML whose data files exist"),
    case("multirun_with_cfg", "theseus.run", ["-m", *RUN, "optimizer.lr=1e-3,2e-3", "--cfg", "hydra"],
         "-m and --cfg cannot be given together", "drop -m"),
    case("init_optimizer_without_init_from", "theseus.run", [*RUN, "trainer.init_optimizer=true"],
         "trainer.init_optimizer=true", "trainer.init_from", "set trainer.init_from=RUN_DIR"),
    case("init_data_without_init_from", "theseus.run", [*RUN, "trainer.init_data=true"], "trainer.init_data=true",
         "trainer.init_from"),
    case("init_from_missing", "theseus.run", [*RUN, "trainer.init_from=nowhere"], "trainer.init_from=nowhere",
         "is no local path", "not in the Hugging Face cache"),
    case("init_from_run_without_checkpoints", "theseus.run", [*RUN, "trainer.init_from=untrained"],
         "untrained holds no checkpoint"),
    case("init_from_corrupt_run", "theseus.run", [*RUN, "trainer.init_from=corrupt"],
         "corrupt/.hydra/config.yaml is not valid YAML"),
    case("tokenizer_unknown_name", "theseus.run", [*RUN, "data.tokenizer=wordpiece"], "wordpiece does not exist",
         "set data.tokenizer to byte, char, bpe"),
    case("tokenizer_folder", "theseus.run", [*RUN, "data.tokenizer=cache"], "data.tokenizer"),
    case("shards_meta_not_json", "theseus.run", [*RUN, "data.source=shards", "data.path=bad_shards"],
         "bad_shards/meta.json"),
    case("shards_meta_without_fields", "theseus.run", [*RUN, "data.source=shards", "data.path=thin_shards"],
         "thin_shards/meta.json"),
]

@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """A user's folder (a trained run, damaged copies, an export, bad files) and every case's result."""
    ws = tmp_path_factory.mktemp("mistakes")
    (ws / "corpus.txt").write_text(Path(json.__file__).read_text() * 2)
    proc = run_python("-m", "theseus.run", *RUN[:-2], "trainer.max_steps=2", "trainer.batch_size=4",
                      "trainer.checkpoint_every=2", "trainer.eval_every=0", "logger.mode=disabled",
                      "hydra.run.dir=run", cwd=ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_python("-m", "theseus.export", "run", "exported", cwd=ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("untrained", "corrupt", "listed", "bad_overrides"):
        shutil.copytree(ws / "run" / ".hydra", ws / name / ".hydra")
    (ws / "corrupt" / "checkpoints").symlink_to(ws / "run" / "checkpoints")
    (ws / "corrupt" / ".hydra" / "config.yaml").write_text("architecture: {n_layers: 2\ntrainer: [\n")
    (ws / "listed" / "checkpoints").symlink_to(ws / "run" / "checkpoints")
    (ws / "listed" / ".hydra" / "config.yaml").write_text("- a\n- b\n")
    (ws / "bad_overrides" / ".hydra" / "overrides.yaml").write_text("trainer.max_steps: 2\n")
    shutil.copytree(ws / "exported", ws / "hf_no_tokenizer")
    (ws / "hf_no_tokenizer" / "tokenizer.json").unlink()
    (ws / "bad_shards").mkdir()
    (ws / "bad_shards" / "meta.json").write_text("{ not json")
    (ws / "thin_shards").mkdir()
    (ws / "thin_shards" / "meta.json").write_text("{}")
    (ws / "my_tasks").mkdir()  # a task YAML over a data file that is not there
    (ws / "my_tasks" / "my_task.yaml").write_text(
        "task: my_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: gone.jsonl\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: label\n")
    cases = {param.id: param.values[:2] for param in CASES}
    (ws.parent / f"{ws.name}-cases.json").write_text(json.dumps(cases))
    proc = run_python("-c", DRIVER, str(ws.parent / f"{ws.name}-cases.json"), devices=2, cwd=ws, timeout=900,
                      env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})  # the hub unreachable, at once
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULTS", 1)[1])


@pytest.mark.parametrize("module, argv, expect", CASES)
def test_a_mistake_is_one_line_and_changes_nothing(results, request, module, argv, expect):
    result = results[request.node.callspec.id]
    stderr = result["stderr"]
    assert result["code"] == 2, f"exit {result['code']!r}; stderr: {stderr[-3000:]}"
    assert "Traceback" not in stderr and stderr.count("\n") == 1 and stderr.endswith("\n"), f"not one line: {stderr!r}"
    assert stderr.startswith("theseus: error: "), stderr
    for text in expect:
        assert text in stderr, f"{text!r} not in {stderr!r}"
    assert result["changed"] == [], f"the user's folder changed: {result['changed']}"


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 60


def test_a_mistake_given_to_launch_is_said_once(tmp_path):
    """Every process refuses it alike: process 0's line alone reaches the console."""
    (tmp_path / "corpus.txt").write_text(Path(json.__file__).read_text())
    proc = run_python("-m", "theseus.launch", "--processes", "2", "--", *RUN, "trainer.bogus=1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("theseus: error: unknown config key 'trainer.bogus'") and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]
