"""The two unique violations the engine gives a meaning to (another job holds the task; a
concurrent append took the seq) are recognised as Citus reports them too: raised on a
shard, whose constraint is ``<name>_<shard id>``, and passed on by the coordinator with
the name only in the message (issue 27). A real server's own report, with the name in
the diagnostics, is driven in tests/integration (TaskAlreadyClaimed, the append races)."""

from __future__ import annotations

import psycopg
import pytest

from callwarden.database.boundary import is_lost_append_race, translate
from callwarden.errors import DatabaseError, TaskAlreadyClaimed


def _unique(constraint: str) -> psycopg.errors.UniqueViolation:
    return psycopg.errors.UniqueViolation(
        f'duplicate key value violates unique constraint "{constraint}"')


@pytest.mark.parametrize("name", ["call_events_pkey", "call_events_pkey_102043"])
def test_a_lost_seq_race_is_known_by_its_constraint_on_a_shard_too(name: str) -> None:
    assert is_lost_append_race(_unique(name))


@pytest.mark.parametrize("name", ["jobs_provider_task_idx", "jobs_provider_task_idx_102008"])
def test_a_claimed_task_is_known_by_its_constraint_on_a_shard_too(name: str) -> None:
    assert isinstance(translate(_unique(name)), TaskAlreadyClaimed)


@pytest.mark.parametrize("name", ["call_events_pkey_x", "call_events_pkeyz",
                                  "assets_job_key_idx", "other_call_events_pkey"])
def test_other_constraints_are_not_taken_for_them(name: str) -> None:
    assert not is_lost_append_race(_unique(name))
    translated = translate(_unique(name.replace("call_events_pkey", "jobs_provider_task_idx")))
    assert not isinstance(translated, TaskAlreadyClaimed)
    assert isinstance(translated, DatabaseError)


def test_another_error_class_with_the_same_words_is_not_a_race() -> None:
    exc = psycopg.errors.CheckViolation('violates unique constraint "call_events_pkey"')
    assert not is_lost_append_race(exc)
