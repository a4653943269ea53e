"""Metric and trace hooks on the database and the transport.

Internal, except :mod:`callwarden.observe.tracing` (docs/api.md)."""
