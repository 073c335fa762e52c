"""Who may do what: admin tokens, API keys, the audit log."""
