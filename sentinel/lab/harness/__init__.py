"""Real dependencies (a throwaway PostgreSQL) started for tests, drills and benchmarks."""
