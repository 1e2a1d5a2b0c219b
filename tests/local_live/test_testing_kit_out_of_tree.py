"""The kit's example copied where a user puts it: a directory of its own with no pytest
configuration (pytest-asyncio in its default strict mode, no conftest, none of this
project's `asyncio_mode = "auto"`). The whole path, from a wheel into a fresh virtualenv, is
`examples/testing_kit/check_out_of_tree.py` in CI (.ci/run): minutes of pip, too slow here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "examples" / "testing_kit" / "test_my_bot.py"


def test_the_copied_kit_passes_without_this_projects_pytest_configuration(tmp_path):
    project = tmp_path / "my_bot"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "my-bot"\nversion = "0"\n')
    shutil.copy(KIT, project / "tests" / KIT.name)
    # The package as installed: here the checkout stands in for the wheel, on the path.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-W", "ignore::pytest.PytestDeprecationWarning", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert "mode=Mode.STRICT" in subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "tests",
         "-o", "console_output_style=classic", "-v"], cwd=project, env=env,
        capture_output=True, text=True, timeout=120).stdout
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout, result.stdout
