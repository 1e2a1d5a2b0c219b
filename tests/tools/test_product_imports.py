"""The product's import path holds no test rig (its wheel neither: test_packaging.py).

The crash harness (rig.crash) and the pipeline fakes (rig.testing) serve the tests,
the benchmarks and `session-store demo` (from a checkout); the testing kit
(service.local_live) is product, and imports neither pipecat nor the rig.
"""

from __future__ import annotations

import json
import subprocess
import sys

RIG = ("rig", "tests", "bench")


def loaded_after(*modules: str) -> list[str]:
    """The modules a fresh interpreter has loaded once it imported `modules`."""
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rig_in(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m in RIG or m.startswith(tuple(f"{r}." for r in RIG))]


def test_the_product_modules_import_no_rig():
    loaded = loaded_after("session_store", "session_store.commands.cli", "session_store.web",
                          "session_store.audit", "service.gemini_live", "service.local_live")
    assert rig_in(loaded) == []


def test_the_testing_kit_imports_neither_pipecat_nor_the_store():
    loaded = loaded_after("service.local_live")
    assert [m for m in loaded if m.split(".")[0] in ("pipecat", "google", "session_store")] == []
    assert rig_in(loaded) == []


def test_the_demo_without_the_rig_says_how_to_run_it():
    # An installed wheel has no `rig`; a checkout does, so it is hidden here.
    code = ("import sys; sys.modules['rig'] = None\n"
            "from session_store.commands.cli import main; sys.argv = ['session-store', 'demo']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert "not part of the installed package" in out.stderr and "make demo" in out.stderr
