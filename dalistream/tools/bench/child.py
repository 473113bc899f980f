"""One measurement in a fresh process: the child's command line, and running it under the monitor."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict

from ...errors import DalistreamError
from ...lifetime import temp_folder
from .monitor import watch

CHILD = "import sys; from dalistream.tools.bench.peers import main; sys.exit(main(sys.argv[1:]))"
# The default child is a script like a training script: torch imported at the top. DALI starts its
# workers with spawn, which runs the parent's main script again in every worker (as __mp_main__):
# that cost is part of what a user pays, so it is measured. --lean-main runs ``python -c`` instead.
SCRIPT = """import torch  # a training script imports torch at the top
import sys

from dalistream.tools.bench.peers import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def run_child(spec: Dict[str, Any], timeout: float, lean_main: bool = False) -> Dict[str, Any]:
    """Run one measurement in a fresh process; its result with the tree's memory peaks and CPU."""
    tmp = temp_folder("bench")  # named by its owner: the next run removes it if this one is killed
    with contextlib.ExitStack() as stack, tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        stack.callback(shutil.rmtree, tmp, True)
        spec_path = os.path.join(tmp, "spec.json")  # a file: shard lists can exceed argv limits
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        if lean_main:
            cmd = [sys.executable, "-c", CHILD]
        else:
            script = os.path.join(tmp, "bench_child.py")
            with open(script, "w") as f:
                f.write(SCRIPT)
            cmd = [sys.executable, script]
        peaks = watch(cmd + [spec_path], stdout=out, stderr=err, timeout=timeout)
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        if peaks["returncode"] != 0 or not lines:
            tail = err.read()[-3000:]
            raise DalistreamError(f"bench run of {spec['system']} failed (exit {peaks['returncode']}):\n{tail}",
                                  hint="run it alone with --repeats 1 to see the whole error")
    result = json.loads(lines[-1])
    result.update(peaks)
    if result.get("samples"):
        result["cpu_ms_per_sample"] = result["cpu_s"] / result["samples"] * 1000
    return result
