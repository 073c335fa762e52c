"""The model catalog and which versions each agent runs."""
