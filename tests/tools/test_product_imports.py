"""The product's import path holds no test rig.

The crash harness (service.crash) and the pipeline fakes (service.testing) serve the tests,
the benchmarks and `session-store demo`, which loads them only when it runs; the testing
kit (service.local_live) is product, and imports neither pipecat nor the rig.
"""

from __future__ import annotations

import json
import subprocess
import sys

RIG = ("service.crash", "service.testing", "tests", "bench")


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
    loaded = loaded_after("session_store", "session_store.cli", "session_store.web",
                          "session_store.audit", "service.gemini_live", "service.local_live")
    assert rig_in(loaded) == []


def test_the_testing_kit_imports_neither_pipecat_nor_the_store():
    loaded = loaded_after("service.local_live")
    assert [m for m in loaded if m.split(".")[0] in ("pipecat", "google", "session_store")] == []
    assert rig_in(loaded) == []
