"""``serve``'s operator listener is never open to whoever reaches it unless the operator
says so (issue 40, item 6): :func:`callwarden.service.app.operator_exposure`."""

from __future__ import annotations

import pytest

from callwarden.errors import ConfigError
from callwarden.service.app import ListenConfig, operator_exposure


def test_the_operator_door_is_open_only_when_said() -> None:
    """Loopback, or a read token: nothing to say; neither: refused naming the settings;
    ``open_operator``: served, with the warning to log."""
    assert operator_exposure(ListenConfig(), None, "T") is None
    assert operator_exposure(ListenConfig(operator_host="10.0.0.5"), "tok", "T") is None
    with pytest.raises(ConfigError, match="set T, or bind it to loopback"):
        operator_exposure(ListenConfig(operator_host="10.0.0.5"), None, "T")
    said = operator_exposure(ListenConfig(operator_host="10.0.0.5", open_operator=True),
                             None, "T")
    assert said is not None
    assert "(open_operator is set)" in said
