"""Where a client's request goes."""
