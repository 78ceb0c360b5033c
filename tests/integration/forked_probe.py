"""Run by test_forked_workers as ``python -m tests.integration.forked_probe``: reports
what a forked model worker starts with, then sleeps if asked to (``sleep``), or starts a
child in its group that outlives it and sleeps (``orphan``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    print(json.dumps({"preloaded": "torch" in sys.modules, "cwd": os.getcwd(),
                      "probe": os.environ.get("INFERQ_PROBE"), "argv": sys.argv[1:],
                      "leads_group": os.getpgid(0) == os.getpid()}), flush=True)
    if sys.argv[1:2] == ["orphan"]:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(json.dumps({"child": child.pid}), flush=True)
    if sys.argv[1:2] in (["sleep"], ["orphan"]):
        time.sleep(600)
