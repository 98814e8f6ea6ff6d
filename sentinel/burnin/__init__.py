"""Pre-launch burn-in: collectives, link localization, straggler screen and SDC check.

The package splits measurement (run inside every rank, imports torch) from judgement (pure
functions over the gathered figures, run on rank 0 and in tests). Fault injection for the
simulated fleet lives in `faults`; the measuring code never reads a scenario.
"""
