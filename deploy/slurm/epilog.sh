#!/bin/bash
# Slurm epilog: drain a node that turned unhealthy during the job, before the next job lands.
# slurm.conf: Epilog=/etc/slurm/sentinel/epilog.sh (with sentinel-gate.sh beside it).
exec "$(dirname "$(readlink -f "$0")")/sentinel-gate.sh" epilog
