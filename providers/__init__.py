"""The outside world: each provider's client and webhook scheme, media downloads and
storage, the transport, and the provider simulator.

Internal, except the API of a provider adapter (:mod:`callwarden.providers.kinds`,
:mod:`callwarden.providers.registry`, :mod:`callwarden.providers.outcomes`,
:mod:`callwarden.providers.errors`, :mod:`callwarden.providers.webhooks`: docs/api.md)."""
