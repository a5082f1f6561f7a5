"""compose.yaml cannot rot where Docker is absent: every llmgw command it runs is resolved
against the real command line (cyclopts parses it, nothing runs), and what it names
(services, volumes, certificates, health checks) exists.

Compose's own rules the checks rely on: ``${NAME:-default}`` is interpolated in every
string value, ``$$`` is a literal ``$``; ``command`` is an argv list or a string split
like a shell would, without running one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import os
import re
import shlex
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from cyclopts import App, CycloptsError

import agent.main as llmgw_agent
from agent.config_values import parse_port_range, parse_server
from agent.gpus.fake import parse_fake_gpus
from agent.simulator.flags import UsageError, parse
from app.commands.serve import serve as serve_command
from app.domain.model_spec import COMMAND_PLACEHOLDERS, ModelSpec, validate_spec

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
PROJECT_PACKAGES = ("app", "agent", "cli")
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash"}
SEPARATORS = {"&&", "||", ";", "|"}
VARIABLE = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
DEFAULTED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>.*))?", re.DOTALL)


# Attributes of the Compose specification (compose-spec.json), so a misspelt key fails here
# instead of being refused, or worse ignored, by one Compose version or another.
TOP_LEVEL_KEYS = {"name", "services", "volumes", "configs", "secrets", "networks"}
SERVICE_KEYS = {
    *("build", "cap_add", "cap_drop", "command", "configs", "depends_on", "deploy"),
    *("entrypoint", "env_file", "environment", "expose", "extra_hosts", "healthcheck"),
    *("hostname", "image", "init", "labels", "logging", "networks", "ports", "profiles"),
    *("read_only", "restart", "secrets", "shm_size", "stop_grace_period", "stop_signal"),
    *("tmpfs", "ulimits", "user", "volumes", "working_dir"),
}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
RESTART_POLICIES = {"no", "always", "on-failure", "unless-stopped"}


class InvalidInvocation(ValueError):
    """A command line that the project's console scripts would refuse."""


# -- reading compose.yaml ---------------------------------------------------------------------


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """``value`` with compose's variable syntax resolved from ``variables`` (else defaults)."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        expression = match["braced"] if match["braced"] is not None else match["bare"]
        parsed = DEFAULTED.fullmatch(expression)
        if parsed is None:
            raise ValueError(f"cannot read the variable {match[0]!r}")
        name, default = parsed["name"], parsed["default"]
        if name in variables:
            return variables[name]
        if default is None:
            raise ValueError(f"{match[0]!r} has no default: `docker compose up` needs it set")
        return default

    return VARIABLE.sub(substitute, value)


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    document = interpolate(yaml.safe_load(path.read_text()), {})
    assert isinstance(document, dict)
    return document


def service_environment(service: Mapping[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.partition("=")[::2] for item in environment)
    return {key: "" if value is None else str(value) for key, value in environment.items()}


def service_argv(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script, each as its words; what cannot be read for
    sure (redirections, subshells, control flow) is refused rather than guessed."""
    commands: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for word in lexer:
            if word in SEPARATORS:
                commands.append(current)
                current = []
            elif set(word) <= set("();<>|&"):
                raise InvalidInvocation(f"cannot check {word!r} in the script line {line!r}")
            else:
                current.append(word)
        commands.append(current)
    return [command for command in commands if command]


def llmgw_invocations(argv: Sequence[str]) -> list[list[str]]:
    """The invocations of project programs in a service's command (inside ``sh -c`` too)."""
    if len(argv) >= 3 and argv[0] in SHELLS and argv[1].startswith("-") and "c" in argv[1]:
        simple_commands = shell_commands(argv[2])
    else:
        simple_commands = [list(argv)]
    found = []
    for words in simple_commands:
        while words and (words[0] == "exec" or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
            words = words[1:]
        if words and Path(words[0]).name.startswith("llmgw"):
            found.append(words)
    return found


# -- resolving a command against the real command line ---------------------------------------


def console_scripts() -> dict[str, str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts: dict[str, str] = pyproject["project"]["scripts"]
    return scripts


def cyclopts_app(script: str) -> App:
    scripts = console_scripts()
    if script not in scripts:
        raise InvalidInvocation(
            f"{script!r} is not a console script of this project ({', '.join(sorted(scripts))})"
        )
    module = importlib.import_module(scripts[script].partition(":")[0])
    app = getattr(module, "app", None)
    if not isinstance(app, App):
        raise InvalidInvocation(f"{scripts[script]} has no cyclopts app named `app`")
    return app


@contextlib.contextmanager
def only_environment(environment: Mapping[str, str]) -> Iterator[None]:
    """The process environment with no LLMGW_* variable but the given ones."""
    saved = dict(os.environ)
    for name in [name for name in os.environ if name.startswith("LLMGW_")]:
        del os.environ[name]
    os.environ.update(environment)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def resolve(
    argv: Sequence[str], environment: Mapping[str, str] = {}
) -> tuple[Callable[..., Any], inspect.BoundArguments]:
    """The project command ``argv`` runs and its arguments, as the program would parse them
    with ``environment``; raises InvalidInvocation for anything the program would refuse."""
    script = Path(argv[0]).name
    app = cyclopts_app(script)
    with only_environment(environment):
        try:
            command, bound, _ = app.parse_args(
                list(argv[1:]), exit_on_error=False, print_error=False
            )
        except CycloptsError as exc:
            raise InvalidInvocation(f"{shlex.join(argv)}: {exc}") from exc
    if not command.__module__.startswith(PROJECT_PACKAGES):
        raise InvalidInvocation(f"{shlex.join(argv)} runs no command (only {command.__name__})")
    for name, value in list(bound.arguments.items()):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            # A command whose flags are one settings struct: its fields are its arguments.
            del bound.arguments[name]
            bound.arguments.update(vars(value))
    return command, bound


# -- the compose file -------------------------------------------------------------------------

COMPOSE = load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
RUNS_LLMGW = {name: service for name, service in SERVICES.items() if "build" in service}


def resolved(name: str) -> list[tuple[Callable[..., Any], inspect.BoundArguments]]:
    """Every llmgw command of service ``name``, resolved as it runs in its container: with
    its environment, and its configs as files (a path to one is checked for existence)."""
    service = SERVICES[name]
    environment = service_environment(service)
    with tempfile.TemporaryDirectory() as directory:
        files = {}
        for index, mount in enumerate(service.get("configs") or []):
            local = Path(directory) / f"{index}-{Path(mount['target']).name}"
            local.write_text(COMPOSE["configs"][mount["source"]]["content"])
            files[mount["target"]] = str(local)
        return [
            resolve([files.get(word, word) for word in words], environment)
            for words in llmgw_invocations(service_argv(service))
        ]


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    dependencies = service.get("depends_on") or {}
    if isinstance(dependencies, list):
        return dict.fromkeys(dependencies, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in dependencies.items()}


def named_volumes(service: Mapping[str, Any]) -> list[str]:
    names = []
    for mount in service.get("volumes") or []:
        source = mount.get("source") if isinstance(mount, dict) else mount.split(":")[0]
        if source and not source.startswith((".", "/", "~")):
            names.append(source)
    return names


@pytest.mark.parametrize("service", RUNS_LLMGW)
def test_every_llmgw_command_is_a_real_command_with_real_options(service: str) -> None:
    assert resolved(service)


def test_every_service_built_from_the_image_runs_an_llmgw_command() -> None:
    assert RUNS_LLMGW, "no service is built from the Dockerfile"
    for name, service in RUNS_LLMGW.items():
        assert llmgw_invocations(service_argv(service)), f"{name} runs no llmgw command"


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["llmgw-server", "serve", "--tls-crt", "server.crt"], "--tls-crt"),
        (["llmgw-server", "serv"], "serv"),
        (["llmgw-server", "serve", "--admin-port", "eighty"], "eighty"),
        (["llmgw-server", "migrate"], "--database-url"),
        (["llmgw-servr", "migrate"], "not a console script"),
        (["llmgw-agent", "--fake-gpu", "2x80GB"], "--fake-gpu"),
        (["llmgw-cli", "cert", "node", "a", "b"], "b"),
        (["llmgw-cli", "cert"], "runs no command"),
        (["llmgw-cli", "--help"], "runs no command"),
    ],
)
def test_the_checker_refuses_what_the_programs_would(argv: list[str], complaint: str) -> None:
    with pytest.raises(InvalidInvocation, match=re.escape(complaint)):
        resolve(argv, {})


def test_the_checker_finds_commands_inside_a_shell_script() -> None:
    script = "test -f ca.crt || llmgw-cli cert init-ca --dri /ca\nLLMGW_X=1 exec llmgw-cli x"
    found = llmgw_invocations(["sh", "-ec", script])
    assert found == [["llmgw-cli", "cert", "init-ca", "--dri", "/ca"], ["llmgw-cli", "x"]]
    with pytest.raises(InvalidInvocation, match="--dri"):
        resolve(found[0])
    with pytest.raises(InvalidInvocation, match="cannot check"):
        llmgw_invocations(["sh", "-c", "llmgw-cli cert show x.crt > out.txt"])


def test_a_variable_without_a_default_is_refused() -> None:
    assert interpolate("a ${X:-1} ${Y-2} $$Z", {}) == "a 1 2 $Z"
    assert interpolate("${X:-1}", {"X": "3"}) == "3"
    with pytest.raises(ValueError, match="no default"):
        interpolate({"k": ["${NOT_SET}"]}, {})


def test_every_key_is_a_compose_attribute() -> None:
    def unknown(mapping: Mapping[str, Any], known: set[str]) -> list[str]:
        return [key for key in mapping if key not in known and not key.startswith("x-")]

    assert unknown(COMPOSE, TOP_LEVEL_KEYS) == []
    for name, service in SERVICES.items():
        assert unknown(service, SERVICE_KEYS) == [], name
        assert unknown(service.get("healthcheck") or {}, HEALTHCHECK_KEYS) == [], name
        assert service.get("restart", "no") in RESTART_POLICIES, name


def test_depends_on_names_services_and_each_condition_can_be_met() -> None:
    for name, service in SERVICES.items():
        for dependency, condition in depends_on(service).items():
            assert dependency in SERVICES, f"{name} depends on unknown service {dependency}"
            target = SERVICES[dependency]
            if condition == "service_healthy":
                assert "healthcheck" in target, f"{name} waits for {dependency} to be healthy"
            elif condition == "service_completed_successfully":
                assert target.get("restart", "no") == "no", f"{dependency} must run once"
            else:
                assert condition == "service_started", f"{name}: unknown condition {condition}"


def test_the_start_order_is_database_then_migrate_and_certs_then_server_then_agents() -> None:
    assert depends_on(SERVICES["migrate"]) == {"postgres": "service_healthy"}
    assert depends_on(SERVICES["server"]) == {
        "certs": "service_completed_successfully",
        "migrate": "service_completed_successfully",
    }
    agents = [name for name in SERVICES if name.startswith("agent-")]
    assert len(agents) == 2
    for agent in [*agents, "cli"]:
        assert depends_on(SERVICES[agent]) == {"server": "service_healthy"}


def test_every_named_volume_is_declared_and_used() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    used = {volume for service in SERVICES.values() for volume in named_volumes(service)}
    assert used <= declared, f"undeclared volumes: {sorted(used - declared)}"
    assert declared <= used, f"unused volumes: {sorted(declared - used)}"
    assert "pgdata" in named_volumes(SERVICES["postgres"])


def test_every_config_is_declared_and_used() -> None:
    declared = set(COMPOSE.get("configs") or {})
    used = {
        mount["source"] if isinstance(mount, dict) else mount
        for service in SERVICES.values()
        for mount in service.get("configs") or []
    }
    assert used == declared


def test_the_demo_model_is_a_valid_spec_whose_engine_command_is_real() -> None:
    (mount,) = SERVICES["cli"]["configs"]
    assert service_argv(SERVICES["cli"]) == ["llmgw-cli", "models", "apply", mount["target"]]
    assert resolved("cli")
    spec = msgspec.convert(
        yaml.safe_load(COMPOSE["configs"][mount["source"]]["content"]), ModelSpec
    )
    assert validate_spec(spec) == []
    placeholders = dict.fromkeys(COMMAND_PLACEHOLDERS, "1") | {"port": "20000", "model": spec.name}
    engine = simulator_arguments(shlex.split(spec.command.format(**placeholders)))
    assert engine.host == "0.0.0.0", "the gateway reaches engines from outside"
    assert engine.port == 20000
    assert engine.model == spec.name, "the gateway forwards the model name as is"


def simulator_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """What ``llmgw-sim-engine`` reads from ``argv`` (its command line is argparse's, not
    cyclopts', so ``resolve`` does not apply); InvalidInvocation for what it would refuse."""
    if Path(argv[0]).name != "llmgw-sim-engine" or "llmgw-sim-engine" not in console_scripts():
        raise InvalidInvocation(f"{shlex.join(argv)} is not the engine simulator")
    try:
        return parse(list(argv[1:]), {})
    except UsageError as exc:
        raise InvalidInvocation(f"{shlex.join(argv)}: {exc}") from exc


def test_the_ca_key_is_seen_by_the_certs_service_only() -> None:
    holders = [name for name, service in SERVICES.items() if "ca" in named_volumes(service)]
    assert holders == ["certs"]


def test_postgres_and_the_server_have_health_checks() -> None:
    assert "pg_isready" in SERVICES["postgres"]["healthcheck"]["test"]
    (_, serve), *_ = resolved("server")
    probe = " ".join(SERVICES["server"]["healthcheck"]["test"])
    assert f"127.0.0.1:{serve.arguments['admin_port']}/readyz" in probe


def test_the_server_serves_the_admin_and_client_listeners_on_published_ports() -> None:
    (command, serve), *_ = resolved("server")
    assert command is serve_command
    published = {port.rsplit(":", 1)[-1] for port in SERVICES["server"]["ports"]}
    for listener in ("admin", "client"):
        assert serve.arguments[f"{listener}_host"] == "0.0.0.0"
        assert str(serve.arguments[f"{listener}_port"]) in published
    assert serve.arguments["admin_port"] != serve.arguments["client_port"]


def test_the_server_and_agents_use_certificates_the_certs_service_issues_for_them() -> None:
    issued = [bound for _, bound in resolved("certs")]
    node_ids = {bound.arguments["node_id"] for bound in issued if "node_id" in bound.arguments}
    server_hosts = {host for bound in issued for host in bound.arguments.get("host", ())}
    (out,) = {bound.arguments["out"] for bound in issued if "out" in bound.arguments}
    (_, serve), *_ = resolved("server")
    assert (serve.arguments["tls_cert"], serve.arguments["tls_key"], serve.arguments["tls_ca"]) == (
        out / "server.crt",
        out / "server.key",
        out / "ca.crt",
    )
    for name in [name for name in SERVICES if name.startswith("agent-")]:
        ((command, agent),) = resolved(name)
        assert command is llmgw_agent.run
        node_id = agent.arguments["node_id"]
        assert node_id in node_ids, f"no node certificate is issued for {node_id}"
        assert agent.arguments["cert"] == out / f"node-{node_id}.crt"
        assert agent.arguments["key"] == out / f"node-{node_id}.key"
        assert agent.arguments["ca"] == out / "ca.crt"
        for server in agent.arguments["server"]:
            address = parse_server(server)
            assert address.host in server_hosts, f"the server certificate lacks {address.host}"
            assert address.port == serve.arguments["agent_port"]


def test_agents_declare_fake_gpus_and_a_valid_port_range() -> None:
    for name in [name for name in SERVICES if name.startswith("agent-")]:
        ((_, agent),) = resolved(name)
        assert len(parse_fake_gpus(agent.arguments["fake_gpus"])) >= 1
        parse_port_range(agent.arguments["port_range"])
