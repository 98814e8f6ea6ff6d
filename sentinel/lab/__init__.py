"""The lab: what runs Sentinel without a fleet, beside the daemons and never inside them.

The drill and demo (`demo/`), the simulated fleet and burn-in fleet (`sim/`), a real Slurm
cluster on one machine (`slurm/`), a throwaway PostgreSQL (`harness/`) and the goodput model
(`goodput/`). The daemons (agent, coordinator, supervisor, rank hosts) never import it
(tests/test_import_boundaries.py).
"""
