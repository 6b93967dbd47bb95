"""Incident simulator: writes the logs a multi-node GPU training job leaves behind, with faults
injected from a library of real incident shapes, plus ``truth.json`` for the evaluator.

Public API::

    simulate(SimOptions(out=Path("sim"), scenario="all", seed=0)) -> list[SimResult]
    simulate_one(name, options) -> SimResult
    scenario_names() -> list[str]
    resolve_scenarios("a,b+c") -> ["a", "b+c"]
"""

from recovery_logs.simulate.generate import (
    FORMATS,
    LOG_PROFILES,
    TRUTH_FILE,
    SimOptions,
    SimResult,
    resolve_scenarios,
    scenario_names,
    simulate,
    simulate_one,
)

__all__ = ["FORMATS", "LOG_PROFILES", "TRUTH_FILE", "SimOptions", "SimResult", "resolve_scenarios", "scenario_names", "simulate",
           "simulate_one"]
