"""Fault tests of issue #6 (scale and faults)."""
