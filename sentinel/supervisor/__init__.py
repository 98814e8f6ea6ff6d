"""The job supervisor (`sentinel run`): launches the gang and carries out job commands."""
