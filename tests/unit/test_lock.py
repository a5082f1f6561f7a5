"""The locks say what every machine installs: `make venv` and CI take requirements/dev.txt,
the image requirements/runtime.txt, both hash-checked with nothing resolved again. A
dependency added to pyproject.toml without `make lock` is caught here, not on a fresh
machine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / lock).read_text()
    found = [(canonicalize_name(name), version) for name, version in PIN.findall(text)]
    assert found, f"requirements/{lock} pins nothing"
    return dict(found)


def hashed(lock: str) -> bool:
    """Whether every pin carries a hash (pip then refuses anything else)."""
    blocks = re.split(r"\n(?=[A-Za-z0-9])", (ROOT / "requirements" / lock).read_text())
    return all("--hash=sha256:" in block for block in blocks if PIN.match(block))


def requirements(*extras: str) -> list[Requirement]:
    """pyproject.toml's requirements with ``extras``, and the install tools, but llmgw."""
    optional = PROJECT["optional-dependencies"]
    build = (ROOT / "requirements" / "build.in").read_text().splitlines()
    wanted = [*PROJECT["dependencies"], *(r for extra in extras for r in optional[extra])]
    wanted += [line for line in build if line.strip() and not line.startswith("#")]
    return [r for r in map(Requirement, wanted) if canonicalize_name(r.name) != "llmgw"]


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("dev.txt", tuple(PROJECT["optional-dependencies"])), ("runtime.txt", ())],
)
def test_each_lock_pins_every_requirement_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    locked = pins(lock)
    for requirement in requirements(*extras):
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement} is not in requirements/{lock}: run `make lock`"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"requirements/{lock} pins {name}=={locked[name]}, outside {requirement}: "
            "run `make lock`"
        )


def test_the_image_gets_the_versions_ci_tested_and_no_bench_or_test_tools() -> None:
    runtime, dev = pins("runtime.txt"), pins("dev.txt")
    assert {name: dev.get(name) for name in runtime} == runtime
    assert not {"matplotlib", "pytest", "mypy", "uv"} & runtime.keys()


@pytest.mark.parametrize("lock", ["dev.txt", "runtime.txt"])
def test_every_pin_is_hashed(lock: str) -> None:
    assert hashed(lock)
