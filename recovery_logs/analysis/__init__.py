"""Looking back: policy backtests, the engine eval harness, detector evaluation, accounting, scenario truth."""
