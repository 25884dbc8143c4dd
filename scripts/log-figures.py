#!/usr/bin/env python3
"""log-figures.py RUN_DIR: the figures of a run's log.jsonl, one a line, in the log's order:
"step N LOSS GRAD_NORM" and "eval N VAL_LOSS", each number as the shortest text that reads
back to the same double (equal text is equal bits). For comparing runs bit for bit."""
import json
import sys

for line in open(sys.argv[1] + "/log.jsonl"):
    r = json.loads(line)
    if r["event"] == "step":
        print("step", r["step"], repr(r["loss"]), repr(r["grad_norm"]))
    elif r["event"] == "eval":
        print("eval", r["step"], repr(r["val_loss"]))
