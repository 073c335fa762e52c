"""Who an agent is: the fleet CA, enrollment, join tokens, session auth."""
