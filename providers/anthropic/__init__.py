"""Anthropic (``anthropic-sync``): ``wire`` (the Messages request, answer and errors:
pure) and ``client`` (the only I/O)."""
