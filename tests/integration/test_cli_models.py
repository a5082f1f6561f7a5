"""`llmgw-cli models apply FILE`, `models`, `model <name>`, `scale`, `remove` against a live
admin API over a real PostgreSQL log."""

from __future__ import annotations

import asyncio
import json
import os
import secrets

import pytest

from app.domain.events import model_stream
from app.store.postgres import PostgresEventStore
from tests.support.operator_cli import OPERATOR, Operator

pytestmark = pytest.mark.timeout(120)


def a_model() -> str:
    return f"llama-{secrets.token_hex(3)}"


def spec_yaml(name: str, replicas: int = 2) -> str:
    return (
        f"name: {name}\n"
        "command: vllm serve meta-llama/Meta-Llama-3-8B --port {port}\n"
        "gpu_memory_gib: 40\n"
        f"replicas: {replicas}\n"
    )


async def test_applying_a_yaml_spec_declares_the_model_once_and_models_lists_it(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = a_model()
    spec = operator.home / "llama.yaml"
    spec.write_text(spec_yaml(name))

    first = await operator.run("models", "apply", str(spec))
    again = await operator.run("models", "apply", str(spec), "--output", "json")
    listed, shown, table = await asyncio.gather(
        operator.run("models", "--output", "json"),
        operator.run("model", name, "--output", "json"),
        operator.run("models"),
    )

    assert first.code == 0, first.stderr
    assert first.stdout == f"model {name}: declared\n"
    [unchanged] = again.json()
    assert (unchanged["changed"], unchanged["model"]["name"]) == (False, name)
    [declared] = await pg_store.read_stream(model_stream(name))
    assert declared.meta.actor == OPERATOR
    assert [m["name"] for m in listed.json()] == [name]
    model = shown.json()
    assert (model["desired"], model["serving"], model["spec"]["gpu_memory_gib"]) == (2, 0, 40)
    assert model["below_desired_because"] == ["2 replica(s) not placed yet"]
    [row] = [line for line in table.stdout.splitlines() if name in line]
    assert "0/2" in row
    assert "2 replica(s) not placed yet" in row


async def test_a_json_file_with_several_specs_declares_each(operator: Operator) -> None:
    names = [a_model(), a_model()]
    specs = [{"name": n, "command": "sim --port {port}", "replicas": 1} for n in names]
    path = operator.home / "fleet.json"
    path.write_text(json.dumps(specs))

    applied = await operator.run("models", "apply", str(path), "--output", "json")

    assert [(c["changed"], c["model"]["name"]) for c in applied.json()] == [
        (True, names[0]),
        (True, names[1]),
    ]


async def test_an_invalid_spec_is_refused_with_each_field_and_reason_and_nothing_is_recorded(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = a_model()
    spec = operator.home / "bad.yaml"
    spec.write_text(spec_yaml(name, replicas=-1) + "routing:\n  weight: 0\n")
    unnamed = operator.home / "unnamed.yaml"
    unnamed.write_text("command: vllm serve x\n")
    broken = operator.home / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    before = await pg_store.last_position()

    refused, nameless, unparsable, missing = await asyncio.gather(
        operator.run("models", "apply", str(spec)),
        operator.run("models", "apply", str(unnamed)),
        operator.run("models", "apply", str(broken)),
        operator.run("models", "apply", str(operator.home / "nowhere.yaml")),
    )

    assert refused.code == 1
    assert f"spec of model '{name}' is invalid" in refused.stderr
    assert "  replicas: must be between 0 and 10000\n" in refused.stderr
    assert "  routing.weight: must be between 0.001 and 1000000\n" in refused.stderr
    assert nameless.code == 1
    assert f"{unnamed}: name: is required" in nameless.stderr
    assert unparsable.code == 1
    assert f"{broken} is not valid YAML at line 2" in unparsable.stderr
    assert missing.code == 2
    assert await pg_store.last_position() == before


async def test_scale_and_remove_record_the_change_and_an_unknown_model_fails(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = a_model()
    spec = operator.home / "llama.yaml"
    spec.write_text(spec_yaml(name))
    assert (await operator.run("models", "apply", str(spec))).code == 0

    scaled = await operator.run("scale", name, "3", "--output", "json")
    same = await operator.run("scale", name, "3")
    removed = await operator.run("remove", name, "--output", "json")
    removed_again = await operator.run("remove", name)
    removed_again_json = await operator.run("remove", name, "--output", "json")
    unknown = await operator.run("scale", "no-such-model", "1")
    negative = await operator.run("scale", name, "-1")
    after_removal = await operator.run("models", "--removed", "--output", "json")

    assert scaled.json()["model"]["desired"] == 3
    assert same.stdout == f"model {name}: already at 3, nothing recorded\n"
    # As scale's, the API's answer: before, a shape of the CLI's own, which said nothing
    # of whether anything was recorded; and removing again said "removed" again.
    assert (removed.json()["changed"], removed.json()["model"]["removed"]) == (True, True)
    assert removed_again.stdout == f"model {name}: already removed, nothing recorded\n"
    assert removed_again_json.json()["changed"] is False
    types = [type(r.event).__name__ for r in await pg_store.read_stream(model_stream(name))]
    assert types == ["ModelDeclared", "ModelScaled", "ModelRemoved"]
    assert unknown.code == 1
    assert "no model 'no-such-model' is known" in unknown.stderr
    assert negative.code == 2
    assert [(m["name"], m["removed"]) for m in after_removal.json()] == [(name, True)]


async def test_a_llamacpp_spec_is_declared_and_shown_with_its_engine(operator: Operator) -> None:
    name = a_model()
    spec = operator.home / "gemma.yaml"
    spec.write_text(
        f"name: {name}\n"
        "engine: llamacpp\n"
        "command: >-\n"
        "  llama-server -m /models/gemma.gguf --alias {model}\n"
        "  --host 0.0.0.0 --port {port} --metrics -np 4 -c 4096\n"
        "replicas: 1\n"
    )

    applied = await operator.run("models", "apply", str(spec))
    listed, shown = await asyncio.gather(
        operator.run("models", "--output", "json"), operator.run("model", name)
    )

    assert applied.code == 0, applied.stderr
    [model] = [m for m in listed.json() if m["name"] == name]
    assert model["spec"]["engine"] == "llamacpp"
    assert any(line.split() == ["engine:", "llamacpp"] for line in shown.stdout.splitlines()), (
        shown.stdout
    )


async def test_an_engine_without_a_profile_is_refused_with_the_known_ones(
    operator: Operator,
) -> None:
    spec = operator.home / "bad-engine.yaml"
    spec.write_text(f"name: {a_model()}\nengine: llama.cpp\ncommand: x --port {{port}}\n")

    refused = await operator.run("models", "apply", str(spec))

    assert refused.code != 0
    assert "must be one of vllm, sglang, llamacpp, openai" in refused.stderr


async def test_a_spec_file_names_the_apis_and_model_shows_them(operator: Operator) -> None:
    name = a_model()
    spec = operator.home / "embedder.yaml"
    spec.write_text(
        f"name: {name}\n"
        "command: vllm serve BAAI/bge-m3 --port {port}\n"
        "apis: [embeddings, rerank, score]\n"
    )
    wrong = operator.home / "wrong.yaml"
    wrong.write_text(f"name: {a_model()}\ncommand: vllm serve x --port {{port}}\napis: [images]\n")

    applied = await operator.run("models", "apply", str(spec))
    shown = await operator.run("model", name)
    refused = await operator.run("models", "apply", str(wrong))

    assert applied.code == 0, applied.stderr
    assert any(
        line.split() == ["apis:", "embeddings,", "rerank,", "score"]
        for line in shown.stdout.splitlines()
    ), shown.stdout
    assert refused.code != 0
    assert "apis" in refused.stderr
    assert "names unknown API(s) 'images'" in refused.stderr


async def test_a_dry_run_says_what_would_change_and_records_nothing(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = a_model()
    spec = operator.home / "llama.yaml"
    spec.write_text(spec_yaml(name))
    assert (await operator.run("models", "apply", str(spec))).code == 0
    spec.write_text(
        spec_yaml(name, replicas=3).replace("--port {port}", "--port {port} -tp 2")
        + "---\n"
        + spec_yaml(f"{name}-new", replicas=1)
    )
    before = await pg_store.last_position()

    shown, answer = await asyncio.gather(
        operator.run("models", "apply", str(spec), "--dry-run"),
        operator.run("models", "apply", str(spec), "--dry-run", "--output", "json"),
    )

    assert shown.code == 0, shown.stderr
    assert f"model {name}: would be revision 2 (now 1): a rollout (rollout-{name}-r2)" in (
        shown.stdout
    )
    assert "  at once: replicas: 2 -> 3\n" in shown.stdout
    assert f"model {name}-new: new, would be declared at revision 1\n" in shown.stdout
    assert shown.stdout.endswith("dry run: nothing was recorded\n")
    changes = answer.json()[0]["revision_changes"]
    assert [c["field"] for c in changes] == ["command"]
    assert changes[0]["new"].endswith("-tp 2")
    assert await pg_store.last_position() == before


async def test_a_dry_run_refuses_a_variable_the_agent_sets_itself_naming_it_and_why(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    # The agent overrode it without a word: the engine ran on the GPUs it was given, not
    # on those the spec named.
    name = a_model()
    spec = operator.home / "llama.yaml"
    spec.write_text(spec_yaml(name) + "env:\n  CUDA_VISIBLE_DEVICES: '0,1'\n")
    before = await pg_store.last_position()

    refused = await operator.run("models", "apply", str(spec), "--dry-run")

    assert refused.code == 1
    assert (
        "  env.CUDA_VISIBLE_DEVICES: is set by the agent from the GPUs it assigns; a spec "
        "cannot set it\n"
    ) in refused.stderr
    assert await pg_store.last_position() == before


async def test_a_file_whose_second_spec_is_invalid_records_none_of_its_specs(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    good, bad = a_model(), a_model()
    path = operator.home / "fleet.yaml"
    path.write_text(spec_yaml(good) + "---\n" + spec_yaml(bad, replicas=-1))
    before = await pg_store.last_position()

    refused = await operator.run("models", "apply", str(path))

    assert refused.code == 1
    assert f"spec 2 in {path}: spec of model '{bad}' is invalid" in refused.stderr
    assert "(nor any other spec of the file)" in refused.stderr
    assert "  replicas: must be between 0 and 10000\n" in refused.stderr
    assert await pg_store.last_position() == before


async def test_a_hostile_spec_file_is_refused_in_one_line_and_nothing_is_recorded(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    name = a_model()
    fifo = operator.home / "fifo.yaml"
    os.mkfifo(fifo)
    twice = operator.home / "twice.yaml"
    twice.write_text(spec_yaml(name, replicas=1) + "replicas: 500\n")
    deep = operator.home / "deep.yaml"
    deep.write_text(spec_yaml(name) + "env: " + "[" * 32 + "]" * 32 + "\n")
    huge = operator.home / "huge.json"
    too_much = {"name": name, "command": "x" * 2**20}
    huge.write_text(json.dumps(too_much))
    sent = len(json.dumps(too_much, separators=(",", ":")))
    before = await pg_store.last_position()

    refused = await asyncio.gather(
        *(operator.run("models", "apply", str(path)) for path in (fifo, twice, deep, huge))
    )

    for result, said in zip(
        refused,
        [
            f"{fifo} is not a regular file but a named pipe (FIFO)",
            f"{twice}: key 'replicas' is given twice in one mapping, at line 4 and line 5",
            f"{deep} (model {name}): nests deeper than 32 levels",
            f"{huge} (model {name}): is {sent:,} bytes as JSON, over the 1 MiB",
        ],
        strict=True,
    ):
        assert (result.code, result.stdout) == (1, ""), result.stderr
        assert result.stderr.startswith(f"llmgw-cli models apply: {said}"), result.stderr
        assert result.stderr.count("\n") == 1
    assert await pg_store.last_position() == before
