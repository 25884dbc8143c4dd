#!/usr/bin/env python3
"""Checkpoint save and resume on 8 CPU ranks (tp 2 x pp 2 x dp 2), before and after: seconds and
bytes per rank, for two llmtrain binaries (--before, --after), measured from the outside.

    scripts/checkpoint-figures.py --before OLD/llmtrain --after build/llmtrain [--scratch DIR]

For each binary, with the same model and data (configs/tiny.toml grown to about 0.45B
parameters: GPT-2, 16 layers of d_model 1536; ZeRO-2, the leanest stage both binaries run at
this size):
  save      1 step, then the end-of-run save; bytes per rank are the rank files' sizes, the
            seconds those between rank 0's step line and its checkpoint line (capture, writes,
            commit);
  resume    the checkpoint resumed on the same layout and as tp 2 x dp 4, and a fresh start of
            each layout as the baseline: bytes read per rank are the difference of the two
            runs' rchar (/proc/PID/io of each rank's process, read at its exit: every read and
            pread, checksums included) less the corpus, which a resumed data loader reads
            again, the seconds the difference between the resume's
            "resumed from" line (printed after the load) and the fresh start's first line of the
            run (printed at the same point of the start-up).
Every rank runs under this script's `wrap` mode, which starts llmtrain, timestamps rank 0's
output lines and records the process's I/O counters and peak resident memory. Needs mpirun
and about 18 GB of memory (run it alone: it holds the machine for about a quarter of an hour on 2
cores).
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

MODEL = ["--set", "model.n_layers=16", "--set", "model.d_model=1536", "--set", "model.n_heads=12", "--set", "model.max_seq_len=64",
         "--set", "train.seq_len=16", "--set", "train.batch_size=1", "--set", "train.global_batch_size=4", "--set", "train.eval_every=0",
         "--set", "train.eval_sequences=1", "--set", "train.sample_tokens=0", "--set", "train.threads=1", "--set", "train.log_every=1",
         "--set", "optimizer.warmup_steps=1", "--set", "parallel.zero_stage=2"]
SAVED = ["--set", "parallel.tp=2", "--set", "parallel.pp=2"]
LAYOUTS = {"same layout (tp 2 x pp 2 x dp 2)": SAVED, "another layout (tp 2 x dp 4)": ["--set", "parallel.tp=2"]}
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def wrap(record, command):
    """One rank: runs command, echoes and timestamps its output, records its I/O counters."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in child.stdout:
        lines.append([time.monotonic() - start, line.rstrip("\n")])
        sys.stdout.write(line)
        sys.stdout.flush()
    # Waited for but not reaped: its /proc entry still holds every thread's counters.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    counters = {}
    with open(f"/proc/{child.pid}/io") as io:
        for row in io:
            key, value = row.split(":")
            counters[key] = int(value)
    code = child.wait()
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the one child's peak resident set
    with open(f"{record}.rank{rank}.json", "w") as out:
        json.dump({"rank": rank, "rchar": counters["rchar"], "wchar": counters["wchar"], "peak_rss": peak_kb * 1024, "lines": lines, "exit": code}, out)
    return code


def run(binary, scratch, name, args):
    """Runs llmtrain train on 8 ranks (or as many as the layout asks for); returns its records."""
    record = os.path.join(scratch, name)
    command = ["mpirun", "--oversubscribe", "-np", "8", sys.executable, os.path.abspath(__file__), "wrap", record, "--", binary, "train",
               "configs/tiny.toml", *MODEL, *args, "--run-dir", os.path.join(scratch, name + "-run")]
    with open(record + ".out", "w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
    if code != 0:
        sys.exit(f"{name} failed (exit {code}): see {record}.out")
    ranks = [json.load(open(f"{record}.rank{r}.json")) for r in range(8)]
    return sorted(ranks, key=lambda r: r["rank"])


def first_time(records, prefix):
    for t, line in records[0]["lines"]:
        if line.startswith(prefix):
            return t
    sys.exit(f"no output line starting with '{prefix}'")


def spread(values):
    return max(values), sum(values) / len(values)


def measure(binary, scratch, tag):
    checkpoints = os.path.join(scratch, tag + "-checkpoints")
    where = ["--set", f'checkpoint.dir="{checkpoints}"']
    saved = run(binary, scratch, tag + "-save", [*SAVED, "--set", "train.steps=1", "--set", "checkpoint.every_steps=1000", *where])
    step_line = first_time(saved, "step 1/1")
    save_seconds = first_time(saved, "checkpoint " + checkpoints) - step_line
    manifest = json.load(open(os.path.join(checkpoints, "step_00000001", "manifest.json")))
    file_bytes = [f["bytes"] for f in manifest["files"]]
    figures = {"checkpoint_bytes": sum(file_bytes), "save_seconds": save_seconds, "written_per_rank": spread(file_bytes),
               "save_peak_rss": max(r["peak_rss"] for r in saved)}
    for layout, args in LAYOUTS.items():
        key = layout.split(" (")[0].replace(" ", "_")
        fresh = run(binary, scratch, f"{tag}-fresh-{key}", [*args, "--set", "train.steps=1"])
        resumed = run(binary, scratch, f"{tag}-resume-{key}", [*args, "--set", "train.steps=2", "--resume", os.path.join(checkpoints, "step_00000001")])
        # A resume also rebuilds the data loader at the saved position, which reads the corpus again.
        corpus = os.path.getsize("data/fortunes.txt")
        read = [r["rchar"] - f["rchar"] - corpus for r, f in zip(resumed, fresh)]
        seconds = first_time(resumed, "resumed from") - first_time(fresh, "llmtrain ")
        figures[key] = {"layout": layout, "seconds": seconds, "read_per_rank": spread(read),
                        "read_total": sum(read), "peak_rss": max(r["peak_rss"] for r in resumed)}
    shutil.rmtree(checkpoints)
    return figures


def report(name, f):
    mb = 1e6
    print(f"{name}: checkpoint {f['checkpoint_bytes'] / mb:.0f} MB")
    high, mean = f["written_per_rank"]
    print(f"  save  {f['save_seconds']:7.1f} s | written per rank: max {high / mb:7.1f} MB, mean {mean / mb:7.1f} MB (max / mean {high / mean:.2f})"
          f" | peak memory of a rank {f['save_peak_rss'] / mb:.0f} MB")
    for key in ("same_layout", "another_layout"):
        r = f[key]
        high, mean = r["read_per_rank"]
        print(f"  resume, {r['layout']}: {r['seconds']:7.1f} s | read per rank: max {high / mb:7.1f} MB, mean {mean / mb:7.1f} MB, "
              f"{r['read_total'] / f['checkpoint_bytes']:.2f}x the checkpoint in all | peak memory of a rank {r['peak_rss'] / mb:.0f} MB")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "wrap":
        sys.exit(wrap(sys.argv[2], sys.argv[sys.argv.index("--") + 1:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the llmtrain binary before (e.g. built from main)")
    parser.add_argument("--after", required=True, help="the llmtrain binary after")
    parser.add_argument("--scratch", help="where runs and checkpoints go (default: a temporary directory, removed after)")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model of d_model 48 instead: checks the script in seconds")
    args = parser.parse_args()
    if args.smoke:
        MODEL[MODEL.index("model.n_layers=16")] = "model.n_layers=2"
        MODEL[MODEL.index("model.d_model=1536")] = "model.d_model=48"
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    scratch = args.scratch or tempfile.mkdtemp(prefix="checkpoint-figures-")
    os.makedirs(scratch, exist_ok=True)
    results = {"before": measure(os.path.abspath(args.before), scratch, "before"), "after": measure(os.path.abspath(args.after), scratch, "after")}
    with open(os.path.join(scratch, "figures.json"), "w") as out:
        json.dump(results, out, indent=2)
    for name, figures in results.items():
        report(name, figures)
    if not args.scratch:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
