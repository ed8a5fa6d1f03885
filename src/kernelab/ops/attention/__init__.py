"""Attention: ragged prefill, paged decode, KV-cache writes and merging partial results."""
