"""The retrieval engine (services/retrieval) is its own package: it imports nothing of the
HTTP/MCP edge (services/query_api) nor a web or metrics framework, and the CLI's offline query
and the eval run without them (issue 32, step 1)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGE_FRAMEWORKS = ("fastapi", "starlette", "mcp", "prometheus_client", "uvicorn")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_engine_imports_no_edge() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in _imports(path)
            if name.startswith("services.query_api") or name.split(".")[0] in EDGE_FRAMEWORKS
        )
        for path in sorted((ROOT / "services/retrieval").glob("*.py"))
    }
    assert not {path: names for path, names in offending.items() if names}


def test_offline_query_and_eval_load_no_web_framework() -> None:
    code = (
        "import sys\n"
        "import services.cli.query, services.eval.runner, services.retrieval.compose\n"
        f"print(sorted(m for m in {EDGE_FRAMEWORKS!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
