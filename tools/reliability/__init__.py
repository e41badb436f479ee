"""Reliability scenarios: storage faults, crashes, hostile inputs, secrets and
long runs, each a function returning its figures and raising
``ScenarioFailure`` when the library misbehaves.

``benchmarks/reliability.py`` runs them all at a chosen scale and prints the
reliability table of docs/BENCHMARKS.md; ``tests/test_reliability_*.py`` run them small in CI.
"""

from tools.reliability.common import ScenarioFailure

__all__ = ["ScenarioFailure"]
