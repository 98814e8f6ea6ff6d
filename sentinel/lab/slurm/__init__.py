"""A real Slurm cluster on one machine, in network namespaces: the test bed of the Slurm
launcher and the Slurm drill."""
