#!/bin/bash
# Slurm prolog: refuse a job on a node the Sentinel agent judges unhealthy, and drain the node.
# slurm.conf: Prolog=/etc/slurm/sentinel/prolog.sh (with sentinel-gate.sh beside it).
exec "$(dirname "$(readlink -f "$0")")/sentinel-gate.sh" prolog
