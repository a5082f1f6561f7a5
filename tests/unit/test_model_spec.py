from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, get_args

import pytest
from msgspec.structs import replace

from agent.engines.spec import ShardSpec, engine_env
from app.domain.commands import start_command
from app.domain.model_spec import (
    AGENT_SET_VARIABLES,
    ENGINES,
    MAX_AGENT_MESSAGE_BYTES,
    MAX_COMMAND_BYTES,
    MAX_GPU_MEMORY_GIB,
    MAX_GPUS_PER_SHARD,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_REPLICAS,
    MAX_SELECTOR_LABELS,
    MAX_SPEC_BYTES,
    MAX_STARTUP_TIMEOUT_S,
    MAX_STOP_GRACE_S,
    MAX_WEIGHT,
    MIN_WEIGHT,
    ModelSpec,
    RoutingSettings,
    SpecError,
    validate_spec,
)
from app.domain.state import ClusterState, Replica, ReplicaPhase, Shard
from app.hub.claims import MAX_GPU_MEMORY_MIB
from app.hub.edge import command_to_wire
from wire.engine_env import AGENT_SET_VARIABLES as AGENT_SETS
from wire.engine_env import LAUNCH_TOKEN_VARIABLE
from wire.engines import ENGINE_NAMES
from wire.errors import MessageTooLarge
from wire.messages import MAX_GPUS_PER_NODE, MAX_MESSAGE_BYTES, Labels, encode

GOOD = ModelSpec(
    name="llama-70b",
    command="vllm serve meta-llama/Llama-3.1-70B --port {port} --tensor-parallel-size {gpu_count}",
    gpus_per_shard=4,
    gpu_memory_gib=70,
)


def test_a_sensible_spec_has_no_errors() -> None:
    assert validate_spec(GOOD) == []


def test_every_problem_is_named_with_its_field() -> None:
    bad = replace(
        GOOD,
        name="Llama 70B!",
        command="vllm serve {model} --port {prot}",
        gpus_per_shard=0,
        routing=RoutingSettings(kv_ceiling=1.5),
    )

    fields = {error.field: error.reason for error in validate_spec(bad)}

    assert set(fields) == {"name", "command", "gpus_per_shard", "routing.kv_ceiling"}
    assert "prot" in fields["command"]
    assert "port" in fields["command"]  # the known placeholders are listed


def test_unbalanced_braces_are_an_error_not_a_crash() -> None:
    errors = validate_spec(replace(GOOD, command="serve --port {port"))
    assert [e.field for e in errors] == ["command"]


NUMERIC_FIELDS = (
    "gpus_per_shard",
    "gpu_memory_gib",
    "shards_per_replica",
    "replicas",
    "startup_timeout_s",
    "stop_grace_s",
    "max_moves",
)
ROUTING_FIELDS = ("weight", "target_waiting", "kv_ceiling")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e308, -1e308])
@pytest.mark.parametrize("field", NUMERIC_FIELDS + tuple(f"routing.{f}" for f in ROUTING_FIELDS))
def test_every_number_is_bounded_and_the_reason_names_the_bound(field: str, value: float) -> None:
    if field.startswith("routing."):
        spec = replace(GOOD, routing=replace(GOOD.routing, **{field.split(".")[1]: value}))
    else:
        spec = replace(GOOD, **{field: value})

    [error] = validate_spec(spec)

    assert error.field == field
    bounds = r"between \S+ and \S+|more than 0 and at most \S+|in \(0, 1\]"
    assert re.fullmatch(rf"must be ({bounds})( \(.*\))?", error.reason)


@pytest.mark.parametrize(
    "spec",
    [
        replace(
            GOOD,
            gpus_per_shard=64,
            shards_per_replica=64,
            gpu_memory_gib=MAX_GPU_MEMORY_GIB,
            replicas=MAX_REPLICAS,
            startup_timeout_s=MAX_STARTUP_TIMEOUT_S,
            stop_grace_s=MAX_STOP_GRACE_S,
            max_moves=MAX_REPLICAS,
            routing=RoutingSettings(weight=MAX_WEIGHT, target_waiting=100_000, kv_ceiling=1),
        ),
        replace(
            GOOD,
            gpus_per_shard=1,
            gpu_memory_gib=0,
            replicas=0,
            startup_timeout_s=5e-324,
            stop_grace_s=0,
            max_moves=1,
            routing=RoutingSettings(weight=MIN_WEIGHT, target_waiting=1, kv_ceiling=5e-324),
        ),
    ],
    ids=["every maximum", "every minimum"],
)
def test_the_bounds_themselves_are_accepted(spec: ModelSpec) -> None:
    assert validate_spec(spec) == []


# -- size: a spec must fit the log, and each shard's start command one agent frame ---------


def test_the_start_command_limit_is_the_agent_channels_frame_limit() -> None:
    assert MAX_AGENT_MESSAGE_BYTES == MAX_MESSAGE_BYTES


def test_a_shard_asks_for_no_more_gpus_or_memory_than_a_node_may_report() -> None:
    """Beyond them a shard could never be placed: the bounds are the hello's."""
    assert MAX_GPUS_PER_SHARD == MAX_GPUS_PER_NODE
    assert MAX_GPU_MEMORY_GIB * 1024 == MAX_GPU_MEMORY_MIB


def test_the_spec_accepts_exactly_the_engines_that_have_a_profile() -> None:
    """The domain cannot import ``wire``: its list of engines is kept equal here."""
    assert ENGINES == ENGINE_NAMES
    for engine in ENGINES:
        assert validate_spec(replace(GOOD, engine=engine)) == []


def test_an_engine_without_a_profile_is_refused_naming_the_known_ones() -> None:
    errors = validate_spec(replace(GOOD, engine="llama.cpp"))
    assert errors == [SpecError("engine", "must be one of vllm, sglang, llamacpp, openai")]


def test_the_start_command_carries_the_specs_engine_to_the_agent() -> None:
    spec = replace(GOOD, engine="llamacpp")
    shard = Shard(index=0, node_id="n1", gpus=(0,), port=8001)
    replica = Replica(
        id="llama-70b-1",
        model=spec.name,
        number=1,
        phase=ReplicaPhase.PLACED,
        shards=(shard,),
        placed_at=datetime.now(UTC),
    )
    command = command_to_wire(start_command(ClusterState(), spec, replica, shard))
    assert command.engine == "llamacpp"


def largest_wire_start_command(spec: ModelSpec) -> int:
    """The bytes of the largest start_shard the control plane would send for ``spec``, with
    every node at the longest address a DNS name can be and the highest ports."""
    node_ids = [f"{i:02d}" + "n" * 251 for i in range(spec.shards_per_replica)]
    shards = tuple(
        Shard(index=i, node_id=node, gpus=tuple(range(99 - spec.gpus_per_shard, 99)), port=65535)
        for i, node in enumerate(node_ids)
    )
    replica = Replica(
        id=f"{spec.name}-2147483647",
        model=spec.name,
        number=2**31 - 1,
        phase=ReplicaPhase.PLACED,
        shards=shards,
        placed_at=datetime.now(UTC),
    )
    # No node is known, so each renders as its id: 253 characters.
    state = ClusterState()
    sizes = []
    for shard in shards:
        command = command_to_wire(start_command(state, spec, replica, shard))
        try:
            sizes.append(len(encode(command)))
        except MessageTooLarge as exc:
            sizes.append(exc.size)
    return max(sizes)


@pytest.mark.parametrize("repeats", [1, 10, 60, 63, 64, 70, 200])
def test_a_spec_is_accepted_exactly_when_every_start_command_fits_a_frame(repeats: int) -> None:
    spec = replace(
        GOOD,
        command="engine " + " ".join(["--peers {peers}"] * repeats),
        gpus_per_shard=8,
        shards_per_replica=64,
        env={"HF_HOME": "/models/cache"},
    )
    size = largest_wire_start_command(spec)

    errors = validate_spec(spec)

    if size <= MAX_MESSAGE_BYTES:
        assert errors == []
    else:
        [error] = errors
        assert error.field == "command"
        assert f"over the agent channel's limit of {MAX_MESSAGE_BYTES} bytes" in error.reason


@pytest.mark.parametrize(("repeats", "bound"), [(63, "up to"), (200, "at least")])
def test_the_refusal_names_the_size_a_start_command_could_reach(repeats: int, bound: str) -> None:
    spec = replace(GOOD, command="engine" + " {peers}" * repeats, shards_per_replica=64)

    [error] = validate_spec(spec)

    found = re.search(r"of (up to|at least) (\d+) bytes", error.reason)
    assert found is not None, error.reason
    size, largest = int(found.group(2)), largest_wire_start_command(spec)
    assert found.group(1) == bound
    assert size >= largest if bound == "up to" else MAX_MESSAGE_BYTES < size <= largest


def test_a_command_or_spec_over_its_limit_is_refused_with_the_size() -> None:
    long_command = replace(GOOD, command="engine " + "x" * MAX_COMMAND_BYTES)
    big_env = replace(GOOD, env={"BLOB": "y" * MAX_SPEC_BYTES})

    assert validate_spec(long_command) == [
        SpecError(
            "command",
            f"is {MAX_COMMAND_BYTES + 7} bytes, over the limit of {MAX_COMMAND_BYTES}",
        )
    ]
    [error] = validate_spec(big_env)
    assert error.field == "(spec)"
    assert error.reason.endswith(f"bytes as JSON, over the limit of {MAX_SPEC_BYTES}")


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("engine {} --port {port}", "unknown placeholder(s) {}"),
        ("engine --port {port:>999999999}", "unknown placeholder(s) {port:>999999999}"),
        ("engine --model {model!r}", "unknown placeholder(s) {model!r}"),
        ('engine --name "unterminated {model}', "cannot be split into words: No closing quotation"),
    ],
    ids=["empty placeholder", "format spec", "conversion", "open quote"],
)
def test_a_command_the_control_plane_could_not_render_is_refused(command: str, reason: str) -> None:
    [error] = validate_spec(replace(GOOD, command=command))

    assert error.field == "command"
    assert error.reason.startswith(reason)


def test_a_placeholders_value_is_one_argument_whatever_it_holds() -> None:
    spec = replace(GOOD, command="engine --host {host} --model '{model} x'")
    shard = Shard(index=0, node_id='127.0.0.7 --evil "flag', gpus=(0,), port=20000)
    replica = Replica(
        id="llama-70b-1",
        model="llama-70b",
        number=1,
        phase=ReplicaPhase.PLACED,
        shards=(shard,),
        placed_at=datetime.now(UTC),
    )

    argv = start_command(ClusterState(), spec, replica, shard).argv

    assert argv == ("engine", "--host", '127.0.0.7 --evil "flag', "--model", "llama-70b x")


# -- the APIs a model serves -------------------------------------------------------------


def test_a_spec_that_names_no_apis_serves_chat_and_completions() -> None:
    assert GOOD.apis == ("chat", "completions")


def test_a_spec_may_name_any_known_apis() -> None:
    spec = replace(GOOD, apis=("embeddings", "rerank", "score", "tokenize"))
    assert validate_spec(spec) == []


@pytest.mark.parametrize(
    ("apis", "reason"),
    [
        ((), "must name at least one API of chat, completions, embeddings"),
        (("chat", "images"), "names unknown API(s) 'images'; known: chat, completions"),
        (("chat", "chat", "score"), "names chat more than once"),
    ],
)
def test_a_bad_list_of_apis_is_refused_naming_the_field(apis: tuple[str, ...], reason: str) -> None:
    [error] = validate_spec(replace(GOOD, apis=apis))
    assert error.field == "apis"
    assert error.reason.startswith(reason)


def test_a_long_list_of_apis_is_refused_quickly() -> None:
    errors = validate_spec(replace(GOOD, apis=("chat",) * 5000 + ("x" * 500,) * 50))
    assert [e.field for e in errors] == ["apis", "apis"]


# -- what an engine process can be given -------------------------------------------------

NO_PROCESS = "no process can be given one"


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        (
            {"command": "vllm serve x --port {port} --chat-template a\x00b"},
            "command",
            f"holds a NUL byte (character 45): {NO_PROCESS}",
        ),
        ({"env": {"HF_HOME": "/models\x00/x"}}, "env.HF_HOME", f"holds a NUL byte: {NO_PROCESS}"),
        ({"env": {"": "x"}}, "env", "holds a variable named '': a name cannot be empty"),
        (
            {"env": {"A=B": "x"}},
            "env",
            "holds a variable named 'A=B': a name cannot hold '=' (the engine would see A "
            "set to 'B=x')",
        ),
        (
            {"env": {"A\x00B": "x"}},
            "env",
            f"holds a variable named 'A\\x00B': a name cannot hold a NUL byte ({NO_PROCESS})",
        ),
    ],
    ids=["command", "env value", "empty env name", "env name with =", "env name with NUL"],
)
def test_what_no_engine_process_can_be_given_is_refused_naming_the_field(
    change: dict[str, Any], field: str, reason: str
) -> None:
    # Accepted, these reached the agent, which failed every start of the replica.
    assert validate_spec(replace(GOOD, **change)) == [SpecError(field, reason)]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("CUDA_VISIBLE_DEVICES", "set by the agent from the GPUs it assigns"),
        ("PORT", "set by the agent to the port it assigns"),
        ("LLMGW_ENGINE_LAUNCH", "set by the agent to find its engine again after a restart"),
    ],
)
def test_a_variable_the_agent_sets_itself_is_refused_naming_it_and_why(name: str, why: str) -> None:
    # The agent overrode it silently: the engine ran with other GPUs than the spec said.
    errors = validate_spec(replace(GOOD, env={"HF_HOME": "/models", name: "0"}))

    assert errors == [SpecError(f"env.{name}", f"is {why}; a spec cannot set it")]


def test_the_variables_the_agent_sets_are_those_the_spec_refuses() -> None:
    """The domain cannot import ``wire``: its list is kept equal to the agent's here."""
    assert dict(AGENT_SET_VARIABLES) == dict(AGENT_SETS)
    spec = ShardSpec(replica_id="r", shard_index=0, model="m", argv=("x",), gpus=(1,), port=9)
    token = {LAUNCH_TOKEN_VARIABLE: "t"}  # set by the supervisor with the launch record
    assert set(AGENT_SET_VARIABLES) == set(engine_env({}, spec)) | set(token)


def test_an_environment_an_engine_can_be_given_is_accepted() -> None:
    env = {"HF_HOME": "/models", "VLLM_LOGGING_LEVEL": "", "lower_case": "é ünïcode \t ok"}
    assert validate_spec(replace(GOOD, env=env)) == []


@pytest.mark.parametrize("name", ["llama\n", "llama\r\n", "\nllama", "lla\nma", "llama\x1b"])
def test_a_name_with_a_line_break_or_control_character_is_refused(name: str) -> None:
    # `$` matches before a trailing newline: "llama\n" was a valid name, in URLs and labels.
    [error] = validate_spec(replace(GOOD, name=name))
    assert error.field == "name"


# -- a node selector a node could match ------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "field", "reason"),
    [
        (
            {"": "h100"},
            "node_selector",
            "holds the key '': a node's label keys are 1-63 characters, so no node could match",
        ),
        (
            {"k" * 64: "h100"},
            "node_selector",
            f"holds the key {'k' * 64!r}: a node's label keys are 1-63 characters, so no node "
            "could match",
        ),
        (
            {"gpu": "h" * 257},
            "node_selector.gpu",
            "is 257 characters: a node's label values are at most 256, so no node could match",
        ),
        (
            {f"k{i}": "v" for i in range(65)},
            "node_selector",
            "has 65 labels: a node has at most 64, so no node could match",
        ),
    ],
    ids=["empty key", "long key", "long value", "many labels"],
)
def test_a_node_selector_no_node_could_match_is_refused(
    selector: dict[str, str], field: str, reason: str
) -> None:
    assert validate_spec(replace(GOOD, node_selector=selector)) == [SpecError(field, reason)]


def test_the_selector_bounds_are_those_of_a_nodes_labels() -> None:
    key, value = get_args(get_args(Labels)[0])
    bounds = [get_args(t)[1] for t in (key, value)] + [get_args(Labels)[1]]

    assert [(b.min_length, b.max_length) for b in bounds] == [
        (1, MAX_LABEL_KEY_CHARS),
        (None, MAX_LABEL_VALUE_CHARS),
        (None, MAX_SELECTOR_LABELS),
    ]


def test_a_thousand_bad_variables_are_refused_in_a_few_lines() -> None:
    env = {f"A{i}=": "x" for i in range(1000)}

    errors = validate_spec(replace(GOOD, env=env))

    assert len(errors) == 11
    assert errors[-1] == SpecError("env", "and 990 more such problem(s)")


def test_a_flag_the_engine_reads_once_given_twice_is_refused_naming_both() -> None:
    # llama-server would listen on 8080, where the agent never probes: every replica would
    # time out starting.
    spec = ModelSpec(
        name="gemma",
        engine="llamacpp",
        command="llama-server -m /m.gguf --alias {model} --host 0.0.0.0 --port {port} --port 8080",
    )

    assert [(e.field, e.reason) for e in validate_spec(spec)] == [
        (
            "command",
            "gives --port 2 times (--port {port}, then --port 8080): the engine would take "
            "the last one without a word; give it once",
        )
    ]


def test_an_engine_started_with_no_port_is_refused() -> None:
    # llama-server would listen on 8080, where the agent never probes.
    spec = ModelSpec(
        name="gemma",
        engine="llamacpp",
        command="llama-server -m /m.gguf --alias {model} --host 0.0.0.0 --metrics",
    )

    assert [(e.field, e.reason) for e in validate_spec(spec)] == [
        (
            "command",
            "gives the engine no port: it would listen on its default (8080), where the "
            "agent never probes; add --port {port}",
        )
    ]
