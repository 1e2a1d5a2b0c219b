"""Crash harness: run scripted calls in worker processes, SIGKILL them, resume, check I1–I7."""
