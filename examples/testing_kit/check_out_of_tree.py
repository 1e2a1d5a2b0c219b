"""The testing kit where users put it: a fresh project outside this tree, the package
installed from a wheel built from this checkout, `test_my_bot.py` copied next to its tests,
pytest run with no configuration of ours (no `asyncio_mode`, no conftest, no checkout on
the path).

    python examples/testing_kit/check_out_of_tree.py [--python python3.11] [--keep]

Exit status: pytest's (0 when every test of the kit passed). About 3 minutes, most of it pip
installing the dependencies into the new virtualenv (its cache makes later runs faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = Path(__file__).resolve().parent / "test_my_bot.py"
# What a user adds to run the kit: pytest and its asyncio plugin, nothing of ours.
TEST_TOOLS = ("pytest>=8", "pytest-asyncio>=0.24")


def step(text: str) -> float:
    print(f"== {text}", flush=True)
    return time.monotonic()


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=True, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the user's virtualenv (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the project's directory")
    opts = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="kit-out-of-tree-"))
    assert ROOT not in work.parents, "the project must be outside the checkout"
    # Nothing of the checkout on the path: the kit must come from the installed wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        t = step(f"building the wheel of {ROOT}")
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
             str(work / "dist"), str(ROOT)], env=env)
        (wheel,) = (work / "dist").glob("*.whl")
        print(f"   {wheel.name} ({time.monotonic() - t:.0f} s)")

        t = step(f"a fresh virtualenv ({opts.python}) with the wheel, pytest, pytest-asyncio")
        venv = work / "venv"
        run([opts.python, "-m", "venv", str(venv)], env=env)
        python = str(venv / "bin" / "python")
        # Not --quiet: the first install takes minutes, and a silent one looks stuck.
        run([python, "-m", "pip", "install", "--progress-bar", "off", str(wheel), *TEST_TOOLS],
            env=env)
        print(f"   installed ({time.monotonic() - t:.0f} s)")

        project = work / "my_bot"
        (project / "tests").mkdir(parents=True)
        (project / "pyproject.toml").write_text('[project]\nname = "my-bot"\nversion = "0"\n')
        shutil.copy(KIT, project / "tests" / KIT.name)

        t = step(f"pytest in {project} (the kit copied into tests/)")
        result = subprocess.run([python, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                                 "tests"], cwd=project, env=env)
        where = subprocess.run(
            [python, "-c", "import service.local_live as k; print(k.__file__)"],
            cwd=project, env=env, capture_output=True, text=True).stdout.strip()
        print(f"   the kit was imported from {where} ({time.monotonic() - t:.0f} s)")
        if str(ROOT) in where:
            print("   FAILED: that is the checkout, not the installed wheel")
            return 1
        return result.returncode
    finally:
        if opts.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
