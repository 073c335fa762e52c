"""Tools for running edgefleet's own processes: tests, the demo and benchmarks."""
