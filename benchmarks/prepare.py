"""Preparation: MB/s and peak RSS of ``theseus.data.prepare`` on a JSONL corpus, against
``tokenizers``' own ``encode_batch`` on the same documents.

The corpus is this Python's standard library, one file per JSONL row, repeated to ``--mb``
MB; the tokenizer a byte-level BPE of 8192 tokens trained on a part of it. Each side runs in
a fresh process (its peak RSS is its own), the sides interleaved (A B B A ...) for ``--rounds``:
theseus reads, parses, encodes, writes and splits the whole corpus into shards; the reference
is only the time ``tokenizers.Tokenizer.encode_batch`` takes on the same batches of documents
(read and parsed for it, untimed), and ``reference_fast`` that of ``encode_batch_fast`` (the
same ids without offsets: what theseus calls). Then the memory bound: theseus's peak RSS preparing
``--memory-mb`` MB with the byte tokenizer (fast enough for a large corpus on a small machine)
beside the same at a tenth of that size.

    python benchmarks/prepare.py [--mb 40] [--rounds 2] [--memory-mb 1200]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

SIDES = ("theseus", "reference", "reference_fast")  # reference: encode_batch; _fast: encode_batch_fast


def write_corpus(path: Path, mb: float) -> int:
    """A JSONL file of the standard library's files (``{"text", "path"}`` rows), repeated to ``mb``
    MB; its size in bytes."""
    from theseus.data.corpus_files import stdlib_files

    rows = [json.dumps({"text": f.read_text(encoding="utf-8", errors="replace"), "path": str(f)}) + "\n"
            for f in stdlib_files()]
    size = 0
    with path.open("w", encoding="utf-8") as f:
        while size < mb * 1e6:
            for row in rows:
                f.write(row)
                size += len(row.encode("utf-8"))
                if size >= mb * 1e6:
                    break
    return path.stat().st_size


def write_tokenizer(folder: Path) -> Path:
    """A byte-level BPE of 8192 tokens trained on the first ~3 MB of the standard library."""
    from theseus.data.corpus_files import stdlib_files
    from theseus.data.tokenizer import HFTokenizer

    texts, size = [], 0
    for f in stdlib_files():
        texts.append(f.read_text(encoding="utf-8", errors="replace"))
        size += len(texts[-1])
        if size > 3e6:
            break
    HFTokenizer.train(texts, 8192).save(folder)
    return folder / "tokenizer.json"


def run_side(side: str, corpus: str, tokenizer: str, cache: str) -> dict:
    """In this (fresh) process: one side's seconds and peak RSS (MiB), and the RSS after imports."""
    from theseus.data.config import DataConfig
    from theseus.data.documents import documents
    from theseus.data.prepare import prepare
    from theseus.data.corpus_files import corpus_files

    cfg = DataConfig(source="jsonl", path=corpus, tokenizer=tokenizer, cache_dir=cache)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if side == "theseus":
        began, cpu = time.perf_counter(), cpu_seconds()
        prepare(cfg)
        seconds, cpu = time.perf_counter() - began, cpu_seconds() - cpu
    else:  # reference: encode_batch; reference_fast: encode_batch_fast (no offsets), which theseus calls
        import tokenizers

        reference, seconds, cpu = tokenizers.Tokenizer.from_file(tokenizer), 0.0, 0.0
        encode = reference.encode_batch if side == "reference" else reference.encode_batch_fast
        for batch in documents(cfg, corpus_files(cfg)):
            began, used = time.perf_counter(), cpu_seconds()
            encode(batch.texts, add_special_tokens=False)
            seconds, cpu = seconds + time.perf_counter() - began, cpu + cpu_seconds() - used
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mib": peak,
            "rss_after_imports_mib": baseline}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=40, help="corpus size of the throughput comparison (MB)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, interleaved")
    parser.add_argument("--memory-mb", type=float, default=1200, help="corpus size of the memory bound (MB)")
    parser.add_argument("--child", nargs=4, metavar=("SIDE", "CORPUS", "TOKENIZER", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_side(*args.child)))
        return
    from common import child, interleaved, save, show, spread  # the parent only: a child's RSS stays its own

    work = Path(tempfile.mkdtemp(prefix="theseus-prepare-bench-"))
    try:
        corpus = work / "corpus.jsonl"
        size = write_corpus(corpus, args.mb)
        tokenizer = str(write_tokenizer(work))
        runs: dict[str, list[dict]] = {name: [] for name in SIDES}

        def side(name: str) -> float:
            cache = work / f"cache-{name}"
            runs[name].append(child(__file__, "--child", name, str(corpus), tokenizer, str(cache)))
            shutil.rmtree(cache, ignore_errors=True)
            return runs[name][-1]["seconds"]

        samples = interleaved({name: lambda name=name: side(name) for name in SIDES}, args.rounds)
        throughput = {name: {"mb_per_s": spread([size / 1e6 / s for s in seconds]), "seconds": spread(seconds),
                             "cpu_seconds": spread([r["cpu_seconds"] for r in runs[name]]),
                             "peak_rss_mib": max(r["peak_rss_mib"] for r in runs[name])}
                      for name, seconds in samples.items()}
        ratios = {name: spread([r / t for t, r in zip(samples["theseus"], samples[name], strict=True)])
                  for name in SIDES[1:]}
        memory = {}
        for mb in (args.memory_mb / 10, args.memory_mb):
            big = work / f"memory-{mb:g}.jsonl"
            big_size = write_corpus(big, mb)
            run = child(__file__, "--child", "theseus", str(big), "byte", str(work / "cache-memory"))
            shutil.rmtree(work / "cache-memory", ignore_errors=True)
            big.unlink()
            memory[f"{big_size / 1e6:.0f} MB"] = {**run, "mb_per_s": big_size / 1e6 / run["seconds"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [(f"{name} (bpe 8192, {size / 1e6:.0f} MB)", r["mb_per_s"]["median"], f"{r['seconds']['median']:.1f}",
             f"{r['cpu_seconds']['median']:.1f}", f"{r['peak_rss_mib']:.0f}") for name, r in throughput.items()]
    rows += [(f"theseus (byte, {label})", r["mb_per_s"], f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}",
              f"{r['peak_rss_mib']:.0f}") for label, r in memory.items()]
    show("prepare: a JSONL corpus into shards, vs tokenizers' encode_batch alone",
         ["run", "MB/s (median)", "seconds (median)", "CPU seconds", "peak RSS MiB"], rows,
         note="theseus's throughput / each reference's, per round: " + "; ".join(
             f"{name} median {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})" for name, r in ratios.items())
         + f" over {args.rounds} interleaved rounds")
    save("prepare", {"corpus_bytes": size, "throughput": throughput, "ratio": ratios, "memory": memory})


if __name__ == "__main__":
    sys.exit(main())
