"""A hostile spec file given to ``llmgw-cli models apply``: a FIFO or a device that would be
read for ever, a file of gigabytes, a key given twice, nesting a thousand deep, a few lines
of YAML aliases that stand for gigabytes of JSON. Each is refused within seconds, in one
line naming the file and what is wrong, with exit code 1 as any unreadable spec file, and
nothing is sent: the admin URL here has nobody listening, so a request would fail
differently."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

from app.admin.bodies import MAX_BODY_BYTES, MAX_BODY_DEPTH
from cli.spec_file import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_MERGED_KEYS,
    MAX_SPEC_JSON_BYTES,
    read_specs,
)
from devcluster.processes import program
from tests.support.ports import free_port

CLI = program("llmgw-cli")
MEMORY_BYTES = 2**30
"""What the command may map: a file read whole, or aliases written out, fail here first
instead of filling the machine."""
WITHIN_S = 20.0
QUICKLY_S = 10.0
"""Refused well within this (the command starts in about a second)."""
HEAD = "name: llama\ncommand: vllm serve x --port {port}\n"


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def apply(path: Path | str) -> tuple[int, str, str, float]:
    """``llmgw-cli models apply path``: exit code, stdout, stderr and seconds taken."""
    return run("models", "apply", str(path))


def run(*argv: str) -> tuple[int, str, str, float]:
    """``llmgw-cli argv...``: exit code, stdout, stderr and seconds taken."""
    environment = os.environ | {
        "COLUMNS": "200",
        "TERM": "dumb",
        "LLMGW_ADMIN_URL": f"http://127.0.0.1:{free_port()}",
    }
    started = time.monotonic()
    done = subprocess.run(
        [CLI, *argv],
        capture_output=True,
        text=True,
        env=environment,
        timeout=WITHIN_S,
        check=False,
        preexec_fn=limit_memory,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def assert_refused(path: Path | str, line: str) -> None:
    """``models apply path`` exits 1 quickly, saying ``line`` (after the command's name)."""
    code, out, err, took = apply(path)

    assert (code, out, err) == (1, "", f"llmgw-cli models apply: {line}\n")
    assert took < QUICKLY_S


def written(tmp_path: Path, text: str, name: str = "llama.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_bounds_are_the_admin_apis() -> None:
    assert (MAX_DEPTH, MAX_SPEC_JSON_BYTES) == (MAX_BODY_DEPTH, MAX_BODY_BYTES)


# -- what is not a file, or too much of one -------------------------------------------------


def test_a_fifo_is_refused_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "llama.yaml"
    os.mkfifo(fifo)

    assert_refused(
        fifo,
        f"{fifo} is not a regular file but a named pipe (FIFO): write the specs to a file and "
        "give that",
    )


def test_a_device_is_refused_instead_of_read_for_ever() -> None:
    assert_refused(
        "/dev/zero",
        "/dev/zero is not a regular file but a character device: write the specs to a file "
        "and give that",
    )


def test_a_file_over_4_mib_is_refused_with_its_size(tmp_path: Path) -> None:
    big = written(tmp_path, HEAD + "#" * (MAX_FILE_BYTES - len(HEAD)) + "\n")

    assert_refused(
        big, f"{big} is {MAX_FILE_BYTES + 1:,} bytes, over the 4 MiB a spec file may hold"
    )


# -- keys given twice ------------------------------------------------------------------------


TWICE = "is given twice in one mapping, at line"
IN_A_LIST = "- " + HEAD.replace("\n", "\n  ")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (HEAD + "replicas: 1\nreplicas: 5\n", f"key 'replicas' {TWICE} 3 and line 4"),
        (HEAD + "env: {HF_HOME: /a, HF_HOME: /b}\n", f"key 'HF_HOME' {TWICE} 3 and line 3"),
        (
            IN_A_LIST + "routing:\n    weight: 1\n    weight: 2\n",
            f"key 'weight' {TWICE} 4 and line 5",
        ),
    ],
)
def test_a_yaml_key_given_twice_is_refused_naming_it_and_both_lines(
    tmp_path: Path, text: str, line: str
) -> None:
    # PyYAML kept the last silently: `replicas: 1` then `replicas: 5` declared 5.
    spec = written(tmp_path, text)

    assert_refused(spec, f"{spec}: {line}; one would be ignored")


def test_a_json_key_given_twice_is_refused_naming_it(tmp_path: Path) -> None:
    spec = written(
        tmp_path, '{"name": "llama", "command": "x", "replicas": 1, "replicas": 5}', "llama.json"
    )

    assert_refused(
        spec, f"{spec}: key 'replicas' is given twice in one object; one would be ignored"
    )


def test_keys_a_merge_brings_may_be_overridden_as_yaml_means(tmp_path: Path) -> None:
    spec = written(
        tmp_path,
        "- &defaults {name: llama, command: x, replicas: 2, env: {A: '1'}}\n"
        "- <<: *defaults\n  name: qwen\n  replicas: 3\n",
    )

    assert read_specs(spec) == [
        {"name": "llama", "command": "x", "replicas": 2, "env": {"A": "1"}},
        {"name": "qwen", "command": "x", "replicas": 3, "env": {"A": "1"}},
    ]


# -- nesting --------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_as_deep_as_the_admin_api_reads_is_read(tmp_path: Path) -> None:
    # The spec is one level, env the next: 30 lists more make 32.
    spec = written(tmp_path, HEAD + f"env: {nested(MAX_DEPTH - 1)}\n")

    [read] = read_specs(spec)

    assert read["env"] == json.loads(nested(MAX_DEPTH - 1))


def test_nesting_one_level_deeper_is_refused_naming_where(tmp_path: Path) -> None:
    spec = written(tmp_path, HEAD + f"env: {nested(MAX_DEPTH)}\n")

    assert_refused(
        spec,
        f"{spec} (model llama): nests deeper than 32 levels, the most the admin API reads "
        f"(at env{'[0]' * (MAX_DEPTH - 1)})",
    )


@pytest.mark.parametrize("name", ["llama.yaml", "llama.json"])
def test_nesting_a_hundred_thousand_deep_is_refused_quickly(tmp_path: Path, name: str) -> None:
    # Read, both parsers recursed once a level and failed with a traceback.
    spec = written(tmp_path, nested(100_000), name)
    where = " at line 1" if name.endswith(".yaml") else ""

    assert_refused(spec, f"{spec}: nests deeper than 32 levels{where}")


def test_a_yaml_list_holding_itself_is_refused_naming_where(tmp_path: Path) -> None:
    # Sent, msgspec would have recursed without end writing it out.
    spec = written(tmp_path, HEAD + "env: &loop [1.5, *loop]\nargs: [.inf]\n")

    assert_refused(
        spec,
        f"{spec} (model llama): env[1] holds itself (an alias inside its own anchor): JSON "
        "cannot carry it",
    )


# -- what the JSON sent would be ------------------------------------------------------------


def billion_laughs() -> str:
    """Nine levels of ten aliases each: a thousand bytes of YAML, 10**9 strings as JSON."""
    lines = [HEAD.rstrip("\n"), "l0: &l0 lol"]
    for level in range(1, 10):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


def test_yaml_aliases_that_stand_for_gigabytes_of_json_are_refused_quickly(
    tmp_path: Path,
) -> None:
    spec = written(tmp_path, billion_laughs())

    code, out, err, took = apply(spec)

    assert (code, out) == (1, "")
    assert err.startswith(f"llmgw-cli models apply: {spec} (model llama): is ")
    assert err.endswith(
        " bytes as JSON (its YAML aliases written out), over the 1 MiB the admin API takes\n"
    )
    assert int(err.split(": is ")[1].split()[0].replace(",", "")) > 6 * 10**9
    assert took < QUICKLY_S


def test_a_spec_of_exactly_1_mib_as_json_is_read_and_one_byte_more_is_refused(
    tmp_path: Path,
) -> None:
    around = len(json.dumps({"name": "llama", "command": ""}, separators=(",", ":")))
    command = "x" * (MAX_SPEC_JSON_BYTES - around)
    fits = written(tmp_path, json.dumps({"name": "llama", "command": command}), "fits.json")
    over = written(tmp_path, json.dumps({"name": "llama", "command": command + "x"}), "over.json")

    assert [spec["command"] for spec in read_specs(fits)] == [command]
    assert_refused(
        over,
        f"{over} (model llama): is {MAX_SPEC_JSON_BYTES + 1:,} bytes as JSON, over the 1 MiB "
        "the admin API takes",
    )


def test_merge_keys_copying_one_mapping_into_thousands_are_refused(tmp_path: Path) -> None:
    keys = ", ".join(f"k{i}: {i}" for i in range(2_000))
    merging = "".join(f"m{i}: {{<<: *big}}\n" for i in range(MAX_MERGED_KEYS // 2_000 + 1))
    spec = written(tmp_path, HEAD + f"big: &big {{{keys}}}\n" + merging)

    code, out, err, took = apply(spec)

    assert (code, out) == (1, "")
    assert err.startswith(
        f"llmgw-cli models apply: {spec}: merge keys (<<) copy more than 100,000 keys into "
        "mappings (at line "
    )
    assert took < QUICKLY_S


def test_a_key_that_is_not_a_string_is_refused_naming_where(tmp_path: Path) -> None:
    # Sent, msgspec refused to write a null key with a traceback.
    spec = written(tmp_path, HEAD + "env: {~: x}\n")

    assert_refused(
        spec,
        f"{spec} (model llama): env has the key None, not a string: JSON keys are strings "
        "(quote it)",
    )


def test_explain_placement_refuses_a_hostile_spec_file_alike(tmp_path: Path) -> None:
    fifo = tmp_path / "qwen.yaml"
    os.mkfifo(fifo)

    code, out, err, took = run("explain-placement", "--spec", str(fifo))

    assert (code, out) == (1, "")
    assert err == (
        f"llmgw-cli explain-placement: {fifo} is not a regular file but a named pipe (FIFO): "
        "write the specs to a file and give that\n"
    )
    assert took < QUICKLY_S
