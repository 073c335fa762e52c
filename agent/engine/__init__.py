"""Inference engines behind a small interface the HTTP layer depends on."""
