"""The fleet as the coordinator sees it: agent records, the registry, the candidate index,
the time series, lifecycle, request records, metrics."""
