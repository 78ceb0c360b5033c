"""The API process never loads a model: importing and building the app pulls in
neither torch nor transformers (embeddings are answered by workers)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from api.app import create_app
import cli.main, cli.stack  # the CLI and supervisor run in the API's environment too
from jobs.core.settings import Settings
create_app(Settings(database_url="postgresql+psycopg://u@127.0.0.1:1/x",
                    redis_url="redis://127.0.0.1:1/0", object_store_url="file:///tmp/x"))
heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)
print("loaded:", heavy)
sys.exit(1 if heavy else 0)
"""


def test_api_imports_no_torch() -> None:
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loaded: []" in p.stdout
