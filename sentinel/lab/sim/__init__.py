"""The simulated fleet and fault injection: real Sentinel processes on one machine.

- `fleet`: node agents with simulated GPUs (`sentinel agent --sim`) as real processes;
  `SimFleet.inject` writes a hardware fault into a node's GPUs.
- `cluster`: the same agents inside a Slurm test cluster's node namespaces.
- `burnin`: a burn-in's N nodes x G ranks as local gloo processes, with the faults a burn-in
  scenario injects into them (`sentinel.burnin.faults`: slow links, stragglers, silent data
  corruption; the burn-in's own, since a node's validation honours them on simulated GPUs).
- `inject`: the drill injector, which follows a training run and writes node faults at their step.
- `agent_demo`: `python -m sentinel.lab.sim.agent_demo`, two hardware faults on four agents.

The simulated GPUs themselves (`sentinel.agent.nvml.sim`) stay with the agent: they are one of its
GPU backends, and the agent does not depend on this package. Faults a trainer injects into
itself (rank faults, `corrupt_batch`) are in `trainer_hooks.reference.faults`, inside the
training process.
"""
