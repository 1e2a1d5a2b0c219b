"""The layers docs/architecture.md states, as import-linter contracts (pyproject.toml).

The last two tests give the linter contracts the tree breaks, so a linter that checks
nothing (a contract that matches no module, a whitelist that lets all through) fails here.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(config: Path | None = None) -> subprocess.CompletedProcess:
    args = [str(LINT_IMPORTS), "--no-cache"] + (["--config", str(config)] if config else [])
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)


def with_contracts(tmp_path: Path, contracts: list[dict]) -> Path:
    """A config with pyproject's top-level settings and these contracts only."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    lines = ["[tool.importlinter]"]
    lines += [f"{key} = {toml_value(value)}" for key, value in settings.items()
              if key != "contracts"]
    for contract in contracts:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in contract.items()]
    path = tmp_path / "contracts.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace('"', '\\"') + '"'


def test_the_tree_keeps_the_layers_the_architecture_doc_states():
    result = lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_a_forbidden_import_the_tree_has_breaks_its_contract(tmp_path):
    result = lint(with_contracts(tmp_path, [{
        "name": "the service never imports pipecat", "type": "forbidden",
        "source_modules": ["service.gemini_live"], "forbidden_modules": ["pipecat"]}]))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "service.gemini_live -> pipecat" in result.stdout


def test_a_whitelist_the_tree_exceeds_breaks_with_each_stray_import(tmp_path):
    result = lint(with_contracts(tmp_path, [{
        "name": "storage imports only the standard library", "type": "only_imports",
        "source_modules": ["session_store.storage"]}]))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "session_store.storage.store -> sqlalchemy (l." in result.stdout
    # Its own modules and the standard library are not strays.
    assert "-> session_store.storage." not in result.stdout
    assert "-> asyncio" not in result.stdout
