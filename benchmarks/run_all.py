"""Run every CPU benchmark, each in a fresh process, then check the headline figures against
their targets. The GPU script (benchmarks/gpu.py) runs only on a GPU machine.

    python benchmarks/run_all.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, show

from theseus.training.metrics import format_bytes

HERE = Path(__file__).resolve().parent
SCRIPTS = ("overhead", "flops", "startup", "scaling", "data", "prepare", "scale", "large_dry_run", "torch_cpu", "moe", "lora",
           "rollout")


def checks() -> list[tuple[str, str, str, bool]]:
    """(figure, measured, target, met) from the results the scripts wrote."""
    r = {name: json.loads((RESULTS / f"{name}.json").read_text())["results"] for name in SCRIPTS}
    rows = [(f"overhead, paired ratio, {case}", f"{v['paired_ratio']:.3f} (of medians {v['ratio']:.3f})", "<= 1.02",
             v["paired_ratio"] <= 1.02) for case, v in r["overhead"].items()]
    rows += [(f"overhead losses agree, {case}", f"{v['max_loss_rel_diff']:.1e}", "<= 1e-4",
              v["max_loss_rel_diff"] <= 1e-4) for case, v in r["overhead"].items()]
    rows += [(f"matrix products ({where}) / model.flops, {size}", f"{v[f'{where}_dots_over_model']:.6f}", "1 exactly",
              v[f"{where}_dots_flops"] == v["model_flops"]) for size, v in r["flops"].items() for where in ("jaxpr", "xla")]
    rows += [(f"XLA / model.flops, {size}", f"{v['xla_over_model']:.3f}", "within 5%",
              abs(v["xla_over_model"] - 1) <= 0.05) for size, v in r["flops"].items()]
    rows += [("first step of gpt_small", f"{r['startup']['first_step_s']:.1f} s", "< 20 s",
              r["startup"]["first_step_s"] < 20),
             *((f"{name} / bare imports", f"{ratio:.2f}", "<= 1.3", ratio <= 1.3)
               for name, ratio in r["startup"]["quick_to_imports"].items())]
    losses = [v["loss"] for v in r["scaling"]["layouts"].values()]
    rows.append(("scaling: losses agree across meshes", f"{max(losses) - min(losses):.1e}", "<= 1e-4",
                 max(losses) - min(losses) <= 1e-4))
    rows += [(f"data headroom, {job}", f"{min(v['headroom'].values()):,.0f}x", ">= 1x", min(v["headroom"].values()) >= 1)
             for job, v in r["data"].items()]
    rows += [(f"prepare throughput / tokenizers' {name}", f"{v['median']:.2f}x", ">= 0.8x", v["median"] >= 0.8)
             for name, v in r["prepare"]["ratio"].items()]
    rows += [(f"prepare peak RSS, {size} JSONL", f"{v['peak_rss_mib']:.0f} MiB", "< 1024 MiB", v["peak_rss_mib"] < 1024)
             for size, v in r["prepare"]["memory"].items()]
    memory = r["scale"]["memory"]
    for layers in ("unrolled", "scanned"):
        temps = [memory[f"{layers} {policy}"]["temp"] for policy in ("none", "dots", "full")]
        rows.append((f"XLA temp, {r['scale']['memory_size']} {layers}, remat none/dots/full",
                     " / ".join(format_bytes(t) for t in temps), "falling", temps[0] > temps[1] > temps[2]))
    ratio = r["scale"]["compile"]["ratio"]
    rows.append((f"compile, {r['scale']['compile']['layers']} layers, unrolled / scanned", f"{ratio:.2f}x", ">= 3x",
                 ratio >= 3))
    for policy, v in r["large_dry_run"]["policies"].items():
        worst = max(abs(x - 1) for x in v["per_device_over_share"].values())
        rows.append((f"1.3B fsdp=8 remat={policy}: bytes / device vs total / 8", f"{1 + worst:.4f}", "within 2%",
                     worst <= 0.02))
        rows.append((f"1.3B fsdp=8 remat={policy}: compile", f"{v['compile_s']:.0f} s", "< 120 s",
                     v["compile_s"] < 120))
    torch_ratio = r["torch_cpu"]["ratio"]
    rows.append(("CPU tokens/s, theseus / PyTorch eager", f"{torch_ratio:.2f}", "> 1 (aim 1.5)", torch_ratio > 1))
    rows += [(f"GRPO rollout tokens/s / transformers' generate, {mode}", f"{v['ratio']:.2f}x", ">= 2x", v["ratio"] >= 2)
             for mode, v in r["rollout"]["sampling"].items()]
    return rows


def main() -> None:
    began, failed = time.perf_counter(), []
    for name in SCRIPTS:
        print(f"\n== benchmarks/{name}.py", flush=True)
        if subprocess.run([sys.executable, str(HERE / f"{name}.py")], cwd=ROOT, check=False).returncode:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
    rows = checks()
    show(f"targets ({time.perf_counter() - began:.0f} s in all)", ["figure", "measured", "target", "met"],
         [(f, m, t, "yes" if ok else "NO") for f, m, t, ok in rows])


if __name__ == "__main__":
    main()
