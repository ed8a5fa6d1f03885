"""Rendering of ledger runs for people: number formats and the self-contained HTML report."""
