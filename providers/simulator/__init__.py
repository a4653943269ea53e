"""A faithful local fake of the four providers (see :mod:`callwarden.providers.simulator.core`)."""

from callwarden.providers.simulator.core import (
    Fault,
    RunningSimulator,
    Script,
    Simulator,
    Step,
    WebhookPlan,
    main,
    running_simulator,
)

__all__ = [
    "Fault",
    "RunningSimulator",
    "Script",
    "Simulator",
    "Step",
    "WebhookPlan",
    "main",
    "running_simulator",
]
