"""``callwarden check``'s reading of who reaches callwarden's objects (pure:
:func:`callwarden.cli.grant.classify` over the rows ``privileges_roles`` answers)."""

from __future__ import annotations

from callwarden.cli.grant import classify


def role(name: str, *, usage: bool = False, appends: bool = False, reads_all: bool = False,
         reaches: tuple[str, ...] = (), granted: tuple[str, ...] = ()) -> dict[str, object]:
    return {"role": name, "usage": usage, "appends": appends, "reads_all": reads_all,
            "reaches": list(reaches), "granted": list(granted)}


def test_a_runtime_is_one_granted_the_schema_and_the_log_by_grants_of_its_own() -> None:
    found = classify([role("worker", usage=True, appends=True,
                           reaches=("table call_events",), granted=("table call_events",)),
                      role("anon")], [])
    assert found == [("ok", "runtime role(s): worker")]


def test_a_read_everything_role_is_a_note_until_it_holds_a_grant_of_its_own() -> None:
    """pg_write_all_data makes a role able to append to the log, but not the runtime:
    a note; with a grant of its own on callwarden's objects it is a problem."""
    wide = role("monitor", reads_all=True, reaches=("table call_events",))
    assert classify([wide], [])[0][0] == "note"
    granted = role("monitor", reads_all=True, reaches=("table call_events",),
                   granted=("table webhook_deliveries",))
    level, text = classify([granted], [])[0]
    assert level == "problem"
    assert "monitor is not callwarden's runtime but can reach table webhook_deliveries" in text


def test_any_other_reach_or_public_is_a_problem_naming_it() -> None:
    found = classify([role("authenticated", reaches=("table call_events",),
                           granted=("table call_events",))], ["function callwarden_is_stale"])
    assert [level for level, _ in found] == ["problem", "problem", "note"]
    assert "PUBLIC (every role) holds privileges on callwarden's function" in found[0][1]
    assert "authenticated is not callwarden's runtime" in found[1][1]

