"""One benchmark, old code against new, in one run: the figures of both side by side, and
their ratio.

This machine's speed moves by 30 % within minutes, so two runs of a benchmark made apart do
not compare. This runs the same script with the same arguments in a checkout of the old code
and in this tree, alternately (old, new, new, old, ...: drift over the run hits both sides
alike), each in a process of its own that imports that side's packages (PYTHONPATH; checked
before the first round). It prints each run's output, then every line the two sides print
alike (the same words, numbers aside), with each number's median over the rounds: old, new,
new/old.

    python bench/compare.py --old 0f0a24a -- bench/turn_overhead.py --quick
    python bench/compare.py --old /tmp/old-tree --rounds 3 -- bench/takeover_busy.py --quick

`--old` is a directory holding the old tree, or a git revision of this repository (exported
with `git archive` into a temporary directory, removed afterwards).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
# A number standing alone (not part of a word such as p50 or gen2); a unit may follow it.
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\d.])")


def export(revision: str, into: Path) -> Path:
    """The tree of `revision` of this repository, written under `into`."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision], cwd=HERE,
                             check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    tar_path = into.with_suffix(".tar")
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    tar_path.unlink()
    return into


def side_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


def check_imports(tree: Path) -> None:
    """Each side must run its own code, not the installed (editable) package."""
    out = subprocess.run(
        [sys.executable, "-c", "import service, session_store; "
         "print(service.__file__); print(session_store.__file__)"],
        cwd=tree, env=side_env(tree), capture_output=True, text=True, check=True).stdout
    for path in out.split():
        if not Path(path).resolve().is_relative_to(tree.resolve()):
            sys.exit(f"{tree}: imports {path}, not its own tree")


def run_once(tree: Path, script: str, args: list[str]) -> tuple[str, float, int]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, script, *args], cwd=tree, env=side_env(tree),
                          capture_output=True, text=True)
    return done.stdout + (done.stderr if done.returncode else ""), \
        time.monotonic() - started, done.returncode


def figures(output: str) -> dict[tuple[str, int], list[float]]:
    """Each line with numbers, keyed by its words (numbers as #) and how many lines before
    it read the same; JSON lines (a bench's machine-readable copy) are left out."""
    seen: dict[str, int] = defaultdict(int)
    found: dict[tuple[str, int], list[float]] = {}
    for line in output.splitlines():
        if line.lstrip().startswith(("{", "[")):
            continue
        numbers = [float(n) for n in NUMBER.findall(line)]
        if not numbers:
            continue
        # (Columns padded to their numbers' widths: spacing is not part of the words.)
        template = " ".join(NUMBER.sub("#", line).split())
        found[(template, seen[template])] = numbers
        seen[template] += 1
    return found


def medians(runs: list[dict[tuple[str, int], list[float]]]) -> dict[tuple[str, int], list[float]]:
    """Per line, each number's median over the runs that printed that line alike."""
    out: dict[tuple[str, int], list[float]] = {}
    for key in runs[0] if runs else ():
        rows = [r[key] for r in runs if key in r and len(r[key]) == len(runs[0][key])]
        out[key] = [statistics.median(column) for column in zip(*rows)]
    return out


def ratio(old: float, new: float) -> str:
    return f"{new / old:.2f}" if old > 0 and new >= 0 else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True,
                        help="a directory holding the old tree, or a git revision")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs per side, alternating (default %(default)s)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- bench/X.py and its arguments")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the benchmark after --")
    script, bench_args = command[0], command[1:]
    with tempfile.TemporaryDirectory(prefix="bench-old-") as tmp:
        old = Path(args.old)
        if not old.is_dir():
            old = export(args.old, Path(tmp) / "tree")
        sides = {"old": old.resolve(), "new": HERE}
        for tree in sides.values():
            if not (tree / script).is_file():
                sys.exit(f"{tree} has no {script}")
            check_imports(tree)
        outputs: dict[str, list[str]] = {"old": [], "new": []}
        failed = False
        for n in range(args.rounds):
            order = ("old", "new") if n % 2 == 0 else ("new", "old")
            for side in order:
                output, seconds, code = run_once(sides[side], script, bench_args)
                outputs[side].append(output)
                print(f"===== {side} (round {n + 1}, {seconds:.0f} s, exit {code}): "
                      f"{sides[side]}")
                print(output.rstrip())
                failed |= code != 0
    old_m = medians([figures(o) for o in outputs["old"]])
    new_m = medians([figures(o) for o in outputs["new"]])
    print(f"\n===== side by side: {script} {' '.join(bench_args)}; median of "
          f"{args.rounds} run(s) per side, alternating; old = {args.old}, new = this tree")
    print("each line: its words (# for each number), then per number old -> new (new/old)")
    for key in old_m:
        if key not in new_m or len(new_m[key]) != len(old_m[key]):
            continue
        pairs = "  ".join(f"{o:g}->{n:g} ({ratio(o, n)})"
                          for o, n in zip(old_m[key], new_m[key]))
        print(f"{key[0][:110]}\n    {pairs}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
