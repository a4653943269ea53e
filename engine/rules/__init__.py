"""The pure rules the actors share (staleness, the host's status, what an answer
means, the log versus the row).

Internal (docs/api.md)."""
