"""``llmgw-server serve``'s timing flags: a negative adoption setting is refused by name."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.settings import ServeSettings

DATABASE_URL = "postgresql://llmgw@db.example/llmgw"


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("adoption_grace", "--adoption-grace"),
        ("adoption_quiet", "--adoption-quiet"),
        ("adoption_grace_max", "--adoption-grace-max"),
    ],
)
def test_a_negative_adoption_setting_is_refused_by_its_flag(field: str, flag: str) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), **{field: -1.0})

    assert settings.problems() == [f"{flag} must not be negative, not -1.0"]


def test_the_adoption_defaults_are_usable() -> None:
    settings = ServeSettings(database_url=DATABASE_URL)

    assert settings.problems() == []
    assert (settings.adoption_grace, settings.adoption_quiet, settings.adoption_grace_max) == (
        30.0,
        10.0,
        600.0,
    )
