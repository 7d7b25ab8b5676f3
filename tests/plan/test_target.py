"""mesh.target: the run's real train step compiled for a TPU slice or GPU nodes this machine
lacks, as a user meets it (``python -m theseus.run ... trainer.dry_run=true mesh.target=...``)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from support import run_python
from theseus.plan.target import host_bounds, parse, target_named, torus
from theseus.config import ConfigError
from theseus.training.config import TrainerConfig

pytest.importorskip("libtpu", reason="the plan extra: pip install 'theseus[plan]'")

TINY = ["+experiment=gpt_tiny", "logger.mode=disabled"]


def dry_run(tmp_path, *overrides: str, devices: int | None = None) -> list[str]:
    """The dry run's tables (stderr), one per point of a sweep (``-m``) in its order; it must
    succeed, write nothing and print nothing else (libtpu and the CUDA plugin say nothing here)."""
    run_dir = tmp_path / "run"
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", f"hydra.run.dir={run_dir}",
                      f"hydra.sweep.dir={run_dir}", *overrides, devices=devices, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not run_dir.exists()
    tables = tables_of(proc.stderr)
    assert all(line.startswith(("│", "┌", "└", "theseus: warning:")) for table in tables
               for line in table.splitlines()), proc.stderr
    return tables


def tables_of(stderr: str) -> list[str]:
    """A dry run's tables, each point's line that says what it compiles taken out (checked there),
    and the line of a step that does not fit, that says it compiles other settings."""
    stderr = re.sub(r"^theseus: the step does not fit: compiling up to \d+ changed settings for one that does "
                    r"\(trainer.fit_candidates\)\n", "", stderr, flags=re.M)
    compiling = re.compile(r"^theseus: compiling GPT's train step for \d+ .* devices?( \(.*\))?\n", flags=re.M)
    before, *tables = re.split(r"^ *theseus dry run.*\n", stderr, flags=re.M)
    assert compiling.fullmatch(before) and len(compiling.findall(stderr)) == len(tables), stderr  # each point's first line
    return [compiling.sub("", table) for table in tables]


def row(table: str, name: str) -> str:
    """One row's value, its wrapped lines joined."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"│ {re.escape(name)}\s+│", line))
    value = [lines[start].split("│")[2].strip()]
    for line in lines[start + 1:]:
        cells = line.split("│")
        if len(cells) < 3 or cells[1].strip():
            break
        value.append(cells[2].strip())
    return " ".join(value)


def test_target_names_parse_as_the_clouds_sell_them():
    assert parse("tpu:v5e-8") == ("tpu", "v5e", 8, 1) and parse("gpu:h100x8x4") == ("gpu", "h100", 8, 4)
    assert torus(8, 2) == "2x4" and torus(64, 3) == "4x4x4" and torus(16, 3) == "2x2x4"
    with pytest.raises(ConfigError, match=r"mesh.target=tpu:v9-8 is not a known target: .* e.g. tpu:v4-32"):
        parse("tpu:v9-8")


@pytest.mark.parametrize(("name", "devices"), [("tpu:v5e-1", 1), ("tpu:v5e-4", 4), ("tpu:v5e-8", 8), ("tpu:v6e-1", 1),
                                              ("tpu:v6e-4", 4), ("tpu:v6e-8", 8), ("tpu:v4-8", 8), ("tpu:v5p-8", 4)])
def test_every_one_host_slice_is_planned_on_one_host(name, devices):
    """The slices sold as one host (v5litepod-1 among them, what many rent) lay out on one process."""
    target = target_named(name)
    assert len(target.devices) == devices and target.process_count == 1


def test_a_layout_libtpu_cannot_make_is_one_line_naming_ones_it_can(monkeypatch):
    from jax.experimental import topologies

    def refuse(*args, **kwargs):
        raise RuntimeError('INVALID_ARGUMENT: Topology layout "v5e:1x1" is not divisible by the given chips_per_host_bounds')

    monkeypatch.setattr(topologies, "get_topology_desc", refuse)
    with pytest.raises(ConfigError, match=r"^mesh.target=tpu:v5e-1: libtpu cannot lay out 1x1 chips \(INVALID_ARGUMENT: "
                                          r".*\): give one it makes, e.g. tpu:v5e-1, tpu:v5e-4, tpu:v5e-8, tpu:v5e-16$"):
        target_named("tpu:v5e-1")
    assert host_bounds("v5e", "2x4") == {"chips_per_host_bounds": [2, 4, 1]} and host_bounds("v4", "2x2x4") == {}


def test_a_plan_file_is_written_only_by_a_dry_run():
    assert TrainerConfig(dry_run=True, plan_file="plan.jsonl").plan_file == "plan.jsonl"
    with pytest.raises(ConfigError, match=r"^trainer.plan_file=plan.jsonl is written by a dry run: add trainer.dry_run=true$"):
        TrainerConfig(plan_file="plan.jsonl")


@pytest.mark.slow
def test_a_bad_target_is_one_line_and_a_target_needs_a_dry_run(tmp_path):
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", "mesh.target=gpu:rtx4090x2", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "theseus: error: mesh.target=gpu:rtx4090x2 is not a known target")
    proc = run_python("-m", "theseus.run", *TINY, "mesh.target=tpu:v5e-8", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "add trainer.dry_run=true" in proc.stderr
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", "mesh.target=tpu:v5e-8",
                      "trainer.batch_size=12", cwd=tmp_path)  # found once libtpu has made the slice: still one line
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "use a multiple of 8" in proc.stderr
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", "mesh.target=tpu:v5e-8",
                      "trainer.plan_file=missing/plan.jsonl", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == (
        "theseus: error: trainer.plan_file=missing/plan.jsonl: its folder does not exist\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_one_chip_v5e_is_planned_as_a_user_rents_it(tmp_path):
    (table,) = dry_run(tmp_path, "mesh.target=tpu:v5e-1")
    assert row(table, "mesh").endswith("= 1 x TPU v5 lite") and row(table, "fits").startswith("yes")
    assert 0 < float(row(table, "predicted: MFU").rstrip("%")) <= 100


@pytest.mark.slow
def test_fsdp_over_a_v5e_8_matches_eight_cpu_devices_and_over_h100s_fits_with_a_predicted_mfu(tmp_path):
    gpu = importlib.util.find_spec("jax_cuda12_plugin") is not None  # the plan extra's CUDA half
    targets = "tpu:v5e-8,null" + (",gpu:h100x8" if gpu else "")  # null: this machine's 8 CPU devices
    tpu, cpu, *planned = dry_run(tmp_path, "-m", f"mesh.target={targets}", "mesh.data=1", "mesh.fsdp=8", devices=8)
    assert row(tpu, "mesh").endswith("= 8 x TPU v5 lite") and row(cpu, "mesh").endswith("8 x cpu")  # one host
    for name in ("params / device", "optimizer state / device"):  # the same sharding, on other devices
        assert row(tpu, name) == row(cpu, name)
    assert row(tpu, "device memory / device") == "16 GiB (TPU v5e HBM)"
    for table in [tpu, *planned]:
        assert row(table, "fits").startswith("yes")
        mfu = float(row(table, "predicted: MFU").rstrip("%"))
        assert 0 < mfu <= 100
        step = row(table, "predicted: step time")
        assert "-bound; roofline" in step


@pytest.mark.slow
def test_a_step_that_does_not_fit_is_told_the_smallest_change_that_does_compiled(tmp_path):
    # a wider model replicated over the slice's chips (mesh.fsdp=1, data the rest), each shrunk to
    # 10 MB (trainer.memory_limit): its parameters and Adam moments alone are over; sharded, they fit
    wide = ["architecture.d_model=192", "architecture.n_layers=2", "architecture.remat=full",
            "trainer.memory_limit=10000000"]
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", "-m", "mesh.target=tpu:v5e-8",
                      "mesh.fsdp=1,8", *wide, f"hydra.sweep.dir={tmp_path}/sweep", "trainer.plan_file=plan.jsonl",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    searching = "theseus: the step does not fit: compiling up to 4 changed settings for one that does"
    assert proc.stderr.count(searching) == 1
    replicated, sharded = tables_of(proc.stderr)
    assert row(replicated, "fits").startswith("NO") and row(sharded, "fits").startswith("yes")
    # what the replicated point is told fits is the sharded point, compiled alike: the same memory
    advice = re.fullmatch(r"theseus: warning: the step needs \S+ \S+ per device, more than the 9.54 MiB of the "
                          r"device \(trainer.memory_limit\): mesh.fsdp=8 fits \(compiled: (\S+ \S+) per device, "
                          r"predicted MFU ([\d.]+)%\) \(1 compiled in \d+ s\)", replicated.splitlines()[-1])
    assert advice, replicated.splitlines()[-1]
    assert row(sharded, "fits") == f"yes: the step needs {advice.group(1)}"
    assert advice.group(2) == row(sharded, "predicted: MFU").rstrip("%")
    plan = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in proc.stdout.splitlines()
            if line.startswith("│ mesh.fsdp=")}  # the sweep's table: the point that does not fit is marked
    assert plan == {"mesh.fsdp=1": "NO", "mesh.fsdp=8": "yes"}
    assert not (tmp_path / "sweep").exists()
    # trainer.plan_file: each point's plan, and the overrides that run it on the target (planning keys dropped)
    assert proc.stdout.splitlines()[-1] == "plan: plan.jsonl (1 of 2 points fit)"
    points = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    assert [point["overrides"] for point in points] == [[*TINY, f"mesh.fsdp={n}", *wide, f"hydra.sweep.dir={tmp_path}/sweep"]
                                                        for n in (1, 8)]
    assert [(p["target"], p["fits"], p["limit"], p["fits_with"]) for p in points] == [
        ("tpu:v5e-8", False, 10000000, ["mesh.fsdp=8"]), ("tpu:v5e-8", True, 10000000, None)]
    assert points[0]["memory"] > 10000000 >= points[1]["memory"] > 0
    assert all(p["step_s"] > 0 and p["chip_hours"] == pytest.approx(p["step_s"] * 60 * 8 / 3600) for p in points)


@pytest.mark.slow
def test_a_llama_over_a_multi_host_v5p_with_data_fsdp_and_tensor_axes(tmp_path):
    llama = ["architecture.positions=rope", "architecture.activation=swiglu", "architecture.norm=rmsnorm",
             "architecture.n_heads=4", "architecture.n_kv_heads=2"]
    # a plan reads only the tokenizer: a mixture's corpus may be on the cluster alone
    mixture = f"data.mixture={{web: {{source: text, path: '{tmp_path}/on_the_cluster', weight: 0.7}}, " \
              "code: {source: stdlib, weight: 0.3}}"
    [table] = dry_run(tmp_path, *llama, mixture, "mesh.target=tpu:v5p-16", "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2")
    assert "data=2 x fsdp=2 x expert=1 x tensor=2 = 8 x TPU v5 on 2 hosts" in row(table, "mesh")
    assert row(table, "fits").startswith("yes")
    assert float(row(table, "predicted: collectives / step").split()[0]) > 0


@pytest.mark.slow
def test_the_collectives_of_scanned_layers_count_once_per_layer(tmp_path):
    # data parallel: every gradient is all-reduced once, whether its layer is unrolled or in a scan's body
    corpus = ["data.source=text", f"data.path={tmp_path}/on_the_cluster.txt"]  # a plan reads only the tokenizer
    unrolled, scanned = dry_run(tmp_path, "-m", "architecture.scan_layers=false,true", "mesh.target=tpu:v5e-8",
                                "mesh.data=8", "architecture.n_layers=3", *corpus)
    sent = [re.search(r"\((\S+ \S+) sent per device", row(t, "predicted: collectives / step")).group(1)
            for t in (unrolled, scanned)]
    assert sent[0] == sent[1]
    value, unit = sent[0].split()
    params, params_unit = row(unrolled, "params / device").split()
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    # all-reduce sends each gradient twice; the weights' products' gradients in bfloat16 (reduced
    # before their cast to the float32 params'): at least the params' bytes, three times a scan's body once
    assert float(value) * units[unit] >= float(params) * units[params_unit]


@pytest.mark.slow
def test_a_grad_accum_estimated_to_fit_is_named_only_once_compiled_for_the_target(tmp_path):
    # on a TPU, XLA's temporaries of this step stay level as grad_accum doubles: the estimate
    # (activations halved: 1.94 + 6.15 / 2 MiB, libtpu 0.0.42) would fit 5.05 MiB, the compiled step does not
    # (float32 activations: in bfloat16 XLA keeps them all in VMEM, 0 B of temporaries)
    [table] = dry_run(tmp_path, "mesh.target=tpu:v5e-8", "mesh.data=8", "architecture.remat=full",
                      "architecture.dtype.activation=float32", "trainer.memory_limit=5300000",
                      "trainer.fit_candidates=1")
    assert row(table, "fits").startswith("NO")
    warning = table.splitlines()[-1]
    over = re.search(r": compiled over the limit: trainer.grad_accum=2: (\S+) MiB; \d+ not compiled \(raise "
                     r"trainer.fit_candidates to try them\) \(1 compiled in \d+ s\): lower trainer.batch_size", warning)
    assert over and float(over.group(1)) * 2**20 > 5300000, warning


@pytest.mark.slow
def test_a_step_the_target_cannot_compile_is_told_the_change_that_fits_and_that_change_fits(tmp_path):
    """The issue's case: libtpu refuses the step for its memory (a 1.8B-parameter layer
    replicated over a v5e-8's chips); the one line names the change that fits, compiled, which
    planned on its own fits with the same memory."""
    wide = ["mesh.target=tpu:v5e-8", "architecture.n_layers=1", "architecture.d_model=12288"]
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", *wide, "mesh.data=8", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    compiling, searching, error = proc.stderr.splitlines()
    named = re.fullmatch(r"theseus: error: mesh.target=tpu:v5e-8: the train step does not fit: needs (\S+) GiB of HBM "
                         r"per device, has 15.75 GiB: mesh.data=1 mesh.fsdp=8 fits \(compiled: (\S+ \S+) per device, "
                         r"predicted MFU ([\d.]+)%\) \(1 compiled in \d+ s\)", error)
    assert named and float(named.group(1)) > 16, error
    [table] = dry_run(tmp_path, *wide, "mesh.data=1", "mesh.fsdp=8")
    assert row(table, "fits") == f"yes: the step needs {named.group(2)}"
    assert row(table, "predicted: MFU") == f"{named.group(3)}%"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_point_that_does_not_compile_in_the_chips_memory_is_a_row_of_the_plan(tmp_path):
    """libtpu refuses to compile a step larger than the chip's HBM: in a sweep that point is a
    warning and a row that does not fit (what it needs of what the chip has), the other points
    planned; alone, its dry run is the one-line verdict."""
    big = ["mesh.target=tpu:v5e-8", "mesh.data=8", "architecture.seq_len=1024", "architecture.n_layers=1",
           "trainer.fit_candidates=0"]  # no change compiled (the next test's): the verdict says what is left
    proc = run_python("-m", "theseus.run", "-m", *TINY, "trainer.dry_run=true", *big,
                      "trainer.batch_size=32768,16", "trainer.plan_file=plan.jsonl",
                      f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = (r"mesh.target=tpu:v5e-8: the train step does not fit: needs (\S+) GiB of HBM per device, has 15.75 GiB: "
               r"\d+ not compiled \(raise trainer.fit_candidates to try them\): lower trainer.batch_size or "
               r"architecture.seq_len, or plan for more devices \(mesh.target\)")
    warning = re.compile(rf"^theseus: warning: {verdict}\n", flags=re.M)
    needed = warning.search(proc.stderr).group(1)
    assert float(needed) > 16 and proc.stderr.count("theseus dry run for tpu:v5e-8") == 1  # the other point planned
    plan = {cells[1].strip(): [cell.strip() for cell in cells[3:5]] for line in proc.stdout.splitlines()
            if (cells := line.split("│"))[1:2] and cells[1].strip().startswith("trainer.batch_size=")}
    assert plan["trainer.batch_size=32768"] == ["NO", f"{float(needed):.3g} GiB of 15.8 GiB"]
    assert plan["trainer.batch_size=16"][0] == "yes"
    points = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    assert [(p["fits"], p["limit"], p["step_s"] is None) for p in points] == [(False, round(15.75 * 2**30), True),
                                                                               (True, 16 * 2**30, False)]
    assert [p["fits_with"] for p in points] == [None, None]
    assert points[0]["memory"] == pytest.approx(float(needed) * 2**30, rel=1e-3)
    assert proc.stdout.splitlines()[-1] == "plan: plan.jsonl (1 of 2 points fit)"
    proc = run_python("-m", "theseus.run", *TINY, "trainer.dry_run=true", *big, "trainer.batch_size=32768",
                      cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    compiling, error = proc.stderr.splitlines()
    assert compiling.startswith("theseus: compiling") and re.fullmatch(f"theseus: error: {verdict}", error), error
