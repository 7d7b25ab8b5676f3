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

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data.corpora import DOCS, write_corpus
from safetensors.numpy import load_file, save_file
from support import DRIVER, run_python

pytestmark = pytest.mark.slow  # end to end: a real run and a subprocess

DATA = ["data.source=text", "data.path=corpus.txt", "data.cache_dir=cache"]
RUN = ["+experiment=gpt_tiny", *DATA, "logger.mode=offline", "hydra.run.dir=refused", "hydra.sweep.dir=refused-sweep"]
SFT = [*RUN, "task=sft", "data.source=jsonl", "data.path=chats.jsonl", "data.cache_dir=fresh-cache"]  # nothing prepared
SLURM = ["-m", *RUN, "hydra/launcher=slurm"]  # a sweep submitted to SLURM (refused here: no SLURM is needed)
DRY = [*RUN, "trainer.dry_run=true"]
DPO = [*RUN, "task=dpo", "trainer.init_from=run", "data.source=jsonl", "data.path=pairs.jsonl", "trainer.batch_size=4",
       "data.cache_dir=fresh-cache"]
GRPO = [*RUN, "task=grpo", "trainer.init_from=run", "data.source=jsonl", "data.path=prompts.jsonl",
        "grpo.reward=rewards:correct", "grpo.max_completion_length=8", "trainer.batch_size=16"]
LORA = ["data.source=text", "data.path=corpus.txt", "data.cache_dir=cache", "trainer.init_from=base",
        "architecture.lora.rank=4", "trainer.max_steps=2", "trainer.batch_size=4", "trainer.checkpoint_every=2",
        "trainer.eval_every=0", "logger.mode=disabled", "hydra.run.dir=lora"]  # its base is changed after it trained


CHATS = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                       {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]} for a in range(5) for b in range(4)]


def case(name, module, argv, *expect):
    return pytest.param(module, list(argv), list(expect), id=name)


CASES = [
    # theseus.sample
    case("sample_no_path", "theseus.sample", [], "the following arguments are required: path"),
    case("sample_path_missing", "theseus.sample", ["nowhere"], "nowhere is no local path",
         "not in the Hugging Face cache", "give a Hugging Face folder, a theseus run or checkpoint"),
    case("sample_run_from_another_folder", "theseus.sample", ["outputs/tiny"],
         "outputs/tiny does not exist (no folder ", "/outputs/tiny, and no model outputs/tiny in the Hugging Face cache"),  # before: hf download outputs/tiny
    case("sample_negative_temperature", "theseus.sample", ["run", "--temperature", "-1"], "--temperature",
         "must be 0 or more, got '-1'"),
    case("sample_temperature_text", "theseus.sample", ["run", "--temperature", "hot"], "--temperature", "'hot'"),
    case("sample_top_k_zero", "theseus.sample", ["run", "--top-k", "0"], "--top-k", "at least 1"),
    case("sample_top_k_over_vocabulary", "theseus.sample", ["run", "--top-k", "100000"],
         "top_k must be between 1 and the vocabulary size"),
    case("sample_no_new_tokens", "theseus.sample", ["run", "--max-new-tokens", "0"], "--max-new-tokens", "at least 1"),
    case("sample_top_p_over_one", "theseus.sample", ["run", "--top-p", "1.5"], "--top-p",
         "must be between 0 and 1, got '1.5'"),
    case("sample_system_without_chat", "theseus.sample", ["run", "--system", "Be terse."], "--system needs --chat"),
    case("sample_step_not_saved", "theseus.sample", ["run", "--step", "7"], "has no checkpoint of step 7",
         "saved steps are 2"),
    case("sample_negative_step", "theseus.sample", ["run", "--step", "-2"], "--step", "at least 0"),
    case("sample_empty_prompt", "theseus.sample", ["run", "--prompt", ""], "--prompt must hold at least one token"),
    case("sample_misspelt_flag", "theseus.sample", ["run", "--temprature", "1"],
         "unrecognized arguments: --temprature 1; did you mean --temperature?"),
    case("sample_underscored_flag", "theseus.sample", ["run", "--max_new_tokens", "24"],
         "unrecognized arguments: --max_new_tokens 24; did you mean --max-new-tokens?"),
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
    case("evaluate_unknown_task", "theseus.evaluate", ["run", "task=dpx"], "unknown task 'dpx'", "available: "),
    case("evaluate_run_other_tokenizer", "theseus.evaluate", ["run", "data.path=corpus.txt", "data.tokenizer=char"],
         "run reads its data with its own tokenizer", "drop data.tokenizer"),
    case("evaluate_fitted_run_other_data", "theseus.evaluate", ["char_run", "data.path=corpus.txt"],
         "'data.path=corpus.txt'", "(data.tokenizer=char) was fitted to its own data", "no data.* keys"),
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
         "does not divide the 2 devices", "fix mesh.*", "or set mesh.cpu_devices=4: on a CPU, it sets how many "
         "devices there are"),
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
    # tracebacks before: each a line now
    case("target_of_no_nodes", "theseus.run", [*DRY, "mesh.target=gpu:h100x8x0"], "mesh.target=gpu:h100x8x0",
         "give at least one of each"),
    case("target_of_no_chips", "theseus.run", [*DRY, "mesh.target=tpu:v5e-0"], "mesh.target=tpu:v5e-0",
         "power of two"),
    case("plan_file_a_folder", "theseus.run", [*DRY, "mesh.target=tpu:v5e-8", "trainer.plan_file=cache"],
         "trainer.plan_file=cache is a folder", "trainer.plan_file=cache/plan.jsonl"),
    case("moe_d_ff_negative", "theseus.run", [*RUN, "model=moe", "architecture.moe.d_ff=-1"],
         "architecture.moe.d_ff must be positive (or null: architecture.d_ff), got -1"),
    case("expert_axis_not_dividing_the_experts", "theseus.run", [*RUN, "model=moe", "mesh.expert=2",
                                                                 "architecture.moe.n_experts=3"],
         "has 3 along its 'expert' axis (architecture.moe.n_experts=3), which mesh.expert=2 does not split evenly",
         "set architecture.moe.n_experts to a multiple of 2", "mesh.rules.expert=null"),
    case("tensor_axis_not_dividing_the_heads", "theseus.run", [*RUN, "mesh.data=1", "mesh.tensor=2",
                                                               "architecture.n_kv_heads=1"],
         "'kv_heads' axis (architecture.n_kv_heads=1), which mesh.tensor=2 does not split evenly",
         "mesh.rules.kv_heads=null"),
    case("template_adding_a_number_to_a_string", "theseus.run", [*SFT, "data.chat_template=adds_a_number.jinja"],
         "row 1 of data.path=chats.jsonl: the chat template (data.chat_template=adds_a_number.jinja) fails on a "
         "conversation: TypeError: can only concatenate str"),
    case("export_under_a_file", "theseus.export", ["run", "corpus.txt/hf"], "corpus.txt is a file"),
    # accepted silently before
    case("moe_shared_gate_without_a_shared_expert", "theseus.run", [*RUN, "model=moe",
                                                                    "architecture.moe.shared_gate=true"],
         "architecture.moe.shared_gate=true", "architecture.moe.shared_d_ff=0", "set architecture.moe.shared_d_ff"),
    case("lora_of_no_targets", "theseus.run", [*RUN, "architecture.lora.rank=4", "architecture.lora.targets=[]"],
         "architecture.lora.targets=[] adapts no projection", "a full fine-tune", "architecture.lora.rank=0"),
    case("lora_alpha_zero", "theseus.run", [*RUN, "architecture.lora.rank=4", "architecture.lora.alpha=0"],
         "architecture.lora.alpha must be positive"),  # before: said after the compile began
    case("lora_gate_of_a_gelu_mlp", "theseus.run", [*RUN, "architecture.lora.rank=4",
                                                    "architecture.lora.targets=[gate]"],
         "architecture.lora.targets has 'gate'", "drop it from architecture.lora.targets"),
    case("slurm_without_multirun", "theseus.run", [*RUN, "hydra/launcher=slurm"],
         "hydra/launcher=slurm launches the jobs of a sweep (-m)", "add -m"),
    case("submitit_local_without_multirun", "theseus.run", [*RUN, "hydra/launcher=submitit_local"],
         "hydra/launcher=submitit_local launches the jobs of a sweep (-m)"),
    case("slurm_warning_delay_negative", "theseus.run", [*SLURM, "hydra.launcher.signal_delay_s=-30"],
         "hydra.launcher.signal_delay_s=-30 must be positive"),
    case("slurm_of_no_nodes", "theseus.run", [*SLURM, "hydra.launcher.nodes=0"], "hydra.launcher.nodes=0 must be positive"),
    case("slurm_sweep_of_a_negative_lora_rank", "theseus.run", [*SLURM, "architecture.lora.rank=-1,4"],
         "architecture.lora.rank must be 0 or more, got -1"),  # on the submitting machine, not on the cluster
    case("slurm_sweep_of_an_impossible_shape", "theseus.run", [*SLURM, "architecture.d_model=64,65"],
         "architecture.d_model (65) must be divisible by architecture.n_heads (4)"),
    case("slurm_sweep_of_a_mesh_size_zero", "theseus.run", [*SLURM, "mesh.data=0"], "mesh.data=0",
         "must be positive"),
    case("joblib_of_no_jobs", "theseus.run", ["-m", *RUN, "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"],
         "hydra.launcher.n_jobs=0 runs no job"),
    case("optuna_of_no_trials", "theseus.run", ["-m", *RUN, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=0",
                                                "optimizer.lr=interval(1e-4,1e-2)"], "hydra.sweeper.n_trials=0"),
    case("target_with_cpu_devices", "theseus.run", [*DRY, "mesh.target=tpu:v5e-8", "mesh.cpu_devices=2"],
         "mesh.cpu_devices=2", "drop mesh.cpu_devices"),
    case("target_empty", "theseus.run", [*DRY, "mesh.target="], "mesh.target is empty"),
    # written where it must not before
    case("lora_resumed_on_a_changed_base", "theseus.run", LORA, "holds LoRA adapters trained on the base",
         "are not that base's"),
    # misleading before
    case("save_to_disk_folder_as_parquet", "theseus.run", [*RUN, "data.source=parquet", "data.path=corpus_hf"],
         "data.path=corpus_hf is a folder written by datasets' save_to_disk", "use data.source=arrow"),
    case("save_to_disk_folder_as_text", "theseus.cli.prepare", ["data.source=text", "data.path=corpus_hf"],
         "use data.source=arrow"),
    case("parquet_file_as_jsonl", "theseus.cli.prepare", ["data.source=jsonl", "data.path=corpus.parquet"],
         "data.path=corpus.parquet is a parquet file", "use data.source=parquet"),
    case("parquet_column_missing", "theseus.cli.prepare", ["data.source=parquet", "data.path=corpus.parquet",
                                                            "data.cache_dir=fresh-cache"],
         "has no column 'text' (its columns: id, content)"),  # said before anything is prepared
    case("chat_template_without_sft", "theseus.run", [*RUN, "data.source=jsonl", "data.path=chats.jsonl",
                                                      "data.chat_template=chat.jinja"],
         "data.chat_template=chat.jinja renders the conversations of task=sft", "add task=sft"),
    case("conversations_as_documents", "theseus.run", [*RUN, "data.source=jsonl", "data.path=chats.jsonl",
                                                       "data.cache_dir=fresh-cache"],
         "has no field 'text' (its fields: messages)", "add task=sft"),
    case("chat_template_to_prepare", "theseus.cli.prepare", ["data.source=jsonl", "data.path=chats.jsonl",
                                                              "data.chat_template=chat.jinja"],
         "drop data.chat_template"),
    case("template_syntax_error", "theseus.run", [*SFT, "data.chat_template=unclosed.jinja"],
         "the chat template (data.chat_template=unclosed.jinja) does not parse as Jinja (line 1"),
    case("conversations_without_an_assistant", "theseus.run", [*SFT, "data.path=questions.jsonl"],
         "no conversation of data.path=questions.jsonl has an assistant message", "data.train_on=all"),
    case("one_conversation", "theseus.run", [*SFT, "data.path=one.jsonl"], "holds 1 conversation(s)"),
    case("target_not_sold", "theseus.run", [*DRY, "mesh.target=tpu:v5e-12"],
         "mesh.target=tpu:v5e-12: a TPU v5e slice of 12 chips is not sold"),
    case("unknown_target_in_a_sweep", "theseus.run", ["-m", *DRY, "mesh.target=tpu:v5e-8,tpu:v9-8"],
         "mesh.target=tpu:v9-8 is not a known target"),  # before any point compiles
    case("learning_rate", "theseus.run", [*RUN, "optimizer.learning_rate=1e-3"], "did you mean optimizer.lr"),
    case("bare_lr", "theseus.run", [*RUN, "lr=1e-3"], "unknown config key 'lr'; did you mean optimizer.lr"),
    case("hidden_size", "theseus.run", [*RUN, "architecture.hidden_size=128"], "did you mean architecture.d_model"),
    case("train_for_run", "theseus.__main__", ["train", "+experiment=gpt_tiny"], "unknown command 'train'",
         "did you mean theseus run?"),
    # found by trying
    case("mesh_rule_naming_an_axis_twice", "theseus.run", [*RUN, "+mesh.rules.embed=[fsdp,fsdp]"],
         "mesh.rules.embed=", "names a mesh axis twice", "mesh.rules.embed=[fsdp]"),
    case("profile_starting_after_the_last_step", "theseus.run", [*RUN, "trainer.profile_steps=[70,80]"],
         "starts after the run's last step (trainer.max_steps=60)"),
    case("lora_rank_past_the_weights", "theseus.run", [*RUN, "architecture.lora.rank=100"],
         "architecture.lora.rank=100 is more than the rank of the", "at most 64"),
    case("evaluate_dashed_flag", "theseus.evaluate", ["run", "--num-fewshot", "0"],
         "unrecognized arguments: --num-fewshot 0; did you mean --num_fewshot?"),
    case("export_misspelt_flag", "theseus.export", ["run", "out", "--stepp", "2"], "did you mean --step?"),
    case("evaluate_output_path_a_file", "theseus.evaluate", ["run", "--output_path", "corpus.txt"],
         "--output_path corpus.txt is a file"),
    # still mishandled before (issue 68): tracebacks, misleading lines, accepted silently
    case("tokenizer_word_level_without_its_unknown_token", "theseus.run", [*RUN, "data.tokenizer=wordlevel.json",
                                                                           "data.cache_dir=fresh-cache"],
         "wordlevel.json: its WordLevel model's unk_token '<unk>' is not in its vocabulary", "add '<unk>'"),
    case("shards_bytes_per_token_a_string", "theseus.run", [*RUN, "data.source=shards", "data.path=rate_shards"],
         "rate_shards/meta.json: bytes_per_token must be a positive number", "got '1.5'"),
    case("tokenizer_config_without_a_template_as_the_template", "theseus.run",
         [*SFT, "data.chat_template=plain/tokenizer_config.json"],
         "data.chat_template=plain/tokenizer_config.json is a JSON file without a chat_template", "give a Jinja file"),
    case("init_data_of_other_data", "theseus.run", [*RUN, "trainer.init_from=run", "trainer.init_data=true",
                                                    "data.path=corpus2.txt"],
         "trainer.init_data=true reads on where trainer.init_from=run stopped in its data",
         "data.path: 'corpus.txt' -> 'corpus2.txt'", "drop trainer.init_data"),
    case("lm_eval_task_yaml_not_parsing", "theseus.run", [*RUN, "evaluation.lm_eval=[my_bad]",
                                                          "evaluation.lm_eval_include=bad_tasks"],
         "bad_tasks/my_bad.yaml does not parse as YAML (line", "lm-eval skips it, so task 'my_bad' is unknown"),
    case("sample_corrupt_config_without_checkpoints", "theseus.sample", ["corrupt_untrained"],
         "corrupt_untrained/.hydra/config.yaml is not valid YAML"),
    # the post-training corpus: DPO
    case("dpo_key_of_another_task", "theseus.run", [*SFT, "dpo.beta=0.5"],
         "dpo.beta applies to task=dpo only (task=sft here): drop it or set task=dpo"),
    case("grpo_key_of_another_task", "theseus.run", [*DPO, "grpo.beta=0.1"],
         "grpo.beta applies to task=grpo only (task=dpo here)"),
    case("dpo_beta_zero", "theseus.run", [*DPO, "dpo.beta=0"], "dpo.beta must be positive, got 0.0"),
    case("dpo_reference_of_another_architecture", "theseus.run", [*DPO, "dpo.reference=one_layer"],
         "dpo.reference=one_layer: its architecture differs from the policy's (architecture.n_layers: 1 there, 2 here)",
         "give a reference of the policy's architecture"),  # before: a traceback after compiling
    case("dpo_reference_a_plain_file", "theseus.run", [*DPO, "dpo.reference=corpus.txt"],
         "dpo.reference=corpus.txt is a file, not a model"),
    case("dpo_pair_of_mixed_formats", "theseus.run", [*DPO, "data.path=mixed_pairs.jsonl"],
         "mixed_pairs.jsonl line 2: chosen must be a string, as its prompt is"),
    case("dpo_pairs_empty", "theseus.run", [*DPO, "data.path=empty.jsonl"], "data.path=empty.jsonl is empty"),
    case("evaluate_dpo_on_prompts", "theseus.evaluate", ["exported", "task=dpo", "data.source=jsonl",
                                                         "data.path=prompts.jsonl"],
         "prompts.jsonl line 1 has no field 'chosen' (it has 'prompt', 'answer')"),
    # GRPO
    case("grpo_reward_without_kwargs", "theseus.run", [*GRPO, "grpo.reward=rewards:strict"],
         "grpo.reward=rewards:strict cannot take the arguments it is called with: it takes no 'answer'",
         "add **kwargs"),  # before: a TypeError at its first call
    case("grpo_reward_of_a_column_the_rows_lack", "theseus.run", [*GRPO, "grpo.reward=rewards:graded"],
         "its parameter 'solution' is given nothing", "give the rows a 'solution' field"),
    case("grpo_reward_not_callable", "theseus.run", [*GRPO, "grpo.reward=rewards:THRESHOLD"],
         "grpo.reward=rewards:THRESHOLD is not a function (a int)"),
    case("grpo_top_k_beyond_the_vocabulary", "theseus.run", [*GRPO, "grpo.top_k=1000"],
         "grpo.top_k=1000 is more than the 257 tokens of the vocabulary"),
    case("grpo_epsilon_one", "theseus.run", [*GRPO, "grpo.epsilon=1"], "grpo.epsilon must be in (0, 1), got 1.0"),
    case("grpo_every_prompt_too_long", "theseus.run", [*GRPO, "data.path=long_prompts.jsonl"],
         "no train prompt fits architecture.seq_len + 1 = 65 tokens"),
    # model files
    case("sample_gguf_not_gguf", "theseus.sample", ["not.gguf"], "not.gguf does not read as a GGUF file"),
    case("sample_hf_unknown_model_type", "theseus.sample", ["hf_unknown"],
         "hf_unknown/config.json: model_type 'mamba' is not supported"),
    case("sample_hf_heads_not_dividing", "theseus.sample", ["hf_heads"],
         "hf_heads/config.json: n_head=5 does not divide n_embd=64: fix config.json"),  # before: theseus's names
    case("sample_chat_without_a_template", "theseus.sample", ["run", "--chat", "hi"],
         "run has no chat template (a run of task=lm; its tokenizer byte holds none)",
         "give one with --chat-template FILE"),  # before: noise by theseus's default template, exit 0
    case("sample_chat_template_without_chat", "theseus.sample", ["run", "--chat-template", "chat.jinja"],
         "--chat-template needs --chat"),
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
    for name in ("untrained", "corrupt", "listed", "bad_overrides", "char_run"):
        shutil.copytree(ws / "run" / ".hydra", ws / name / ".hydra")
    (ws / "char_run" / "checkpoints").symlink_to(ws / "run" / "checkpoints")  # as if its tokenizer were fitted
    saved = ws / "char_run" / ".hydra" / "config.yaml"
    saved.write_text(saved.read_text().replace("  tokenizer: byte\n", "  tokenizer: char\n"))
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
    shutil.copytree(ws / "exported", ws / "base")  # a LoRA run on a base that then changes under it
    proc = run_python("-m", "theseus.run", *LORA, cwd=ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tensors = load_file(ws / "base" / "model.safetensors")
    save_file({name: value * 2 for name, value in tensors.items()}, ws / "base" / "model.safetensors",
              metadata={"format": "pt"})
    (ws / "chats.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in CHATS))
    (ws / "questions.jsonl").write_text("".join(json.dumps({"messages": chat["messages"][:1]}) + "\n" for chat in CHATS))
    (ws / "one.jsonl").write_text(json.dumps(CHATS[0]) + "\n")
    (ws / "chat.jinja").write_text("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    (ws / "unclosed.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    (ws / "adds_a_number.jinja").write_text("{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}")
    write_corpus(ws / "hf", "datasetdict", DOCS)[0].rename(ws / "corpus_hf")  # a save_to_disk folder
    pq.write_table(pa.table({"id": [0, 1], "content": ["a document", "another"]}), ws / "corpus.parquet")
    (ws / "my_tasks").mkdir()  # a task YAML over a data file that is not there
    (ws / "my_tasks" / "my_task.yaml").write_text(
        "task: my_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: gone.jsonl\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: label\n")
    post_training(ws)
    issue_68(ws)
    cases = {param.id: param.values[:2] for param in CASES}
    (ws.parent / f"{ws.name}-cases.json").write_text(json.dumps(cases))
    proc = run_python("-c", DRIVER, str(ws.parent / f"{ws.name}-cases.json"), devices=2, cwd=ws, timeout=900,
                      env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})  # the hub unreachable, at once
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULTS", 1)[1])


def issue_68(ws: Path) -> None:
    """The files of the cases mishandled until issue 68: a WordLevel tokenizer without its unknown
    token, shards whose meta.json gives bytes_per_token as a string, a tokenizer_config.json without
    a template, a second corpus, a task YAML that does not parse, a broken run without checkpoints."""
    import tokenizers

    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"the": 0, "of": 1}))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.save(str(ws / "wordlevel.json"))
    prepared = next(folder for folder in sorted((ws / "cache").iterdir()) if (folder / "meta.json").is_file())
    shutil.copytree(prepared, ws / "rate_shards")
    meta = json.loads((ws / "rate_shards" / "meta.json").read_text())
    (ws / "rate_shards" / "meta.json").write_text(json.dumps({**meta, "bytes_per_token": "1.5"}))
    (ws / "plain").mkdir()
    (ws / "plain" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (ws / "corpus2.txt").write_text(Path(shutil.__file__).read_text())
    (ws / "bad_tasks").mkdir()
    (ws / "bad_tasks" / "my_bad.yaml").write_text("task: my_bad\ndataset_path: [\n")
    shutil.copytree(ws / "corrupt" / ".hydra", ws / "corrupt_untrained" / ".hydra")


def post_training(ws: Path) -> None:
    """Preference pairs, prompts and reward functions, and model files that are not what they seem."""
    pairs = [{"prompt": f"What is {a} plus 2?", "chosen": f" {a + 2}.", "rejected": f" {a + 3}."} for a in range(20)]
    (ws / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    mixed = [pairs[0], {**pairs[1], "chosen": [{"role": "assistant", "content": "3."}]}]
    (ws / "mixed_pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in mixed))
    (ws / "empty.jsonl").touch()
    (ws / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{a} + 1 =", "answer": str(a + 1)}) + "\n"
                                              for a in range(40)))
    (ws / "long_prompts.jsonl").write_text("".join(json.dumps({"prompt": "x" * 100 + str(a)}) + "\n" for a in range(8)))
    (ws / "rewards.py").write_text(
        "def correct(prompts, completions, completion_ids, answer, **kwargs):\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
        "def strict(prompts, completions, completion_ids):\n    return [0.0] * len(prompts)\n"
        "def graded(prompts, completions, completion_ids, solution, **kwargs):\n    return [0.0] * len(prompts)\n"
        "THRESHOLD = 3\n")
    (ws / "not.gguf").write_text("a text file named .gguf\n")
    for name, changes in (("one_layer", {"n_layer": 1}), ("hf_unknown", {"model_type": "mamba"}),
                          ("hf_heads", {"n_head": 5})):
        shutil.copytree(ws / "exported", ws / name)
        config = json.loads((ws / name / "config.json").read_text())
        (ws / name / "config.json").write_text(json.dumps({**config, **changes}))


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
    assert len(CASES) >= 100


def test_a_mistake_given_to_launch_is_said_once(tmp_path):
    """Every process refuses it alike: process 0's line alone reaches the console."""
    (tmp_path / "corpus.txt").write_text(Path(json.__file__).read_text())
    proc = run_python("-m", "theseus.launch", "--processes", "2", "--", *RUN, "trainer.bogus=1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("theseus: error: unknown config key 'trainer.bogus'") and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]
