"""The service's shape (docs/architecture.md): every commit goes through the one step
(service/step.py), which alone handles `Fenced`, and only the service class writes pipecat's
attributes (through `apply`). Read from the source's syntax tree, so a part that commits on
its own, catches `Fenced` itself or assigns to pipecat's state fails here by name.

The last test runs the same checks on code that breaks each rule, so a check that finds
nothing cannot pass unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"
#: Where a commit may be called: the step, and the driver itself (its own close).
COMMITS_IN = {"step.py", "driver.py"}
#: Where `Fenced` may be caught: the step; the driver marks itself fenced and re-raises.
FENCED_IN = {"step.py", "driver.py"}
#: Names the parts give the service (ServicePort) when they use it.
SERVICE_NAMES = {"svc", "_svc", "service"}


def violations(name: str, source: str) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("observe", "record") and name not in COMMITS_IN \
                and _names_driver(node.func.value):
            found.append((node.lineno, f"commits around the step (.{node.func.attr})"))
        if isinstance(node, ast.ExceptHandler) and node.type is not None \
                and "Fenced" in ast.unparse(node.type) and name not in FENCED_IN:
            found.append((node.lineno, "catches Fenced itself"))
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                   else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr.startswith("_") \
                    and _names_service(target.value):
                found.append((node.lineno, f"writes pipecat's {target.attr}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr" and node.args \
                and _names_service(node.args[0]):
            found.append((node.lineno, "writes pipecat's state (setattr)"))
    return [f"{name}:{line}: {what}" for line, what in sorted(found)]


def _names_driver(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("_driver", "driver")) or (
        isinstance(node, ast.Name) and node.id in ("driver", "_driver"))


def _names_service(node: ast.expr) -> bool:
    """`svc`, `self._svc`, or an attribute of one (`svc._settings`)."""
    while isinstance(node, ast.Attribute):
        if node.attr in SERVICE_NAMES:
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in SERVICE_NAMES


def test_the_parts_commit_only_through_the_step_and_never_write_pipecats_state():
    parts = [p for p in SERVICE.glob("*.py") if p.name != "gemini_live.py"]
    assert {"step.py", "effects.py", "results.py", "log_writer.py"} <= {p.name for p in parts}
    found = [v for p in parts for v in violations(p.name, p.read_text())]
    assert found == [], "\n".join(found)


def test_each_rule_finds_code_that_breaks_it():
    broken = '''
async def f(self, svc):
    await self._driver.observe(x, intend=STARTS)
    await driver.record(*events)
    try:
        pass
    except (Fenced, ValueError):
        pass
    self._svc._session = None
    svc._bot_is_responding = False
    setattr(svc._settings, "model", "m")
'''
    found = violations("part.py", broken)
    assert [v.split(": ", 1)[1] for v in found] == [
        "commits around the step (.observe)", "commits around the step (.record)",
        "catches Fenced itself", "writes pipecat's _session",
        "writes pipecat's _bot_is_responding", "writes pipecat's state (setattr)"], found
    assert violations("step.py", broken)[:2] == [
        "step.py:9: writes pipecat's _session", "step.py:10: writes pipecat's _bot_is_responding"]
