"""`torchrun ... threads_after_main.py ARGS`: grpo_fast's command line with ARGS, then one JSON line on stdout naming
this rank's gloo threads (process group workers, transport loop) still alive after it returned (Linux /proc)."""

import json
import os
import sys

from grpo_fast.cli import main

code = main(sys.argv[1:])
threads = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
report = {"rank": int(os.environ["RANK"]), "gloo_threads": sorted(t for t in threads if "gloo" in t)}
sys.stdout.flush()
os.write(1, (json.dumps(report) + "\n").encode())  # one write: the ranks' lines never interleave (print may use two)
sys.exit(code)
