"""Staged model rollouts: the engine and its gates."""
