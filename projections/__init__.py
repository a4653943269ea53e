"""What the log adds up to: the fold of a call's events into its projection, the columns
it is stored in on the ``jobs`` row, and the timeline an audit reads.

Internal (docs/api.md)."""
