"""Rotary position embeddings."""
