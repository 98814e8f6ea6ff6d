"""Reference 3D-parallel (TP x PP x DP) trainer instrumented with trainer_hooks."""
