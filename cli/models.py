"""`llmgw-cli models`, `models apply FILE`, `model <name>`, `scale <model> <n>`,
`remove <model>`."""

from __future__ import annotations

import shlex
from itertools import dropwhile
from pathlib import Path, PurePosixPath
from typing import Annotated

import msgspec
from cyclopts import App, Parameter, validators

from cli.arguments import MAX_REPLICAS, UsageError, WholeNumberWithin, filled_path, segment
from cli.autoscale import bounds_text, decision_text, inputs_text, policy_text
from cli.client import ADMIN, AdminClient, ApiProblem
from cli.config import ConnectionFlags
from cli.operator import (
    Output,
    Reply,
    call,
    post_change,
    preview_model,
    print_facts,
    put_model,
    run_command,
    show_one,
)
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    Column,
    counted,
    make_console,
    print_error,
    print_json,
    print_table,
    say,
    text,
    utc_seconds,
)
from cli.rollout_views import UNDER_WAY
from cli.spec_file import SpecFileError, read_specs
from cli.traffic import print_traffic_by_revision
from cli.views import ApplyPreview, ModelChange, ModelView, RoutingView, SpecFieldChange
from wire.engines import PROFILES

ModelName = Annotated[str, Parameter(help="The model name, such as llama-3-8b.")]

models_app = App(
    name="models",
    help="""List the declared models: replicas serving and desired, the bounds of those
autoscaled (`auto 1..8`), and why a model is short if it is. `models apply FILE` declares
them from a spec file.

```
llmgw-cli models
llmgw-cli models --output json | jq -r '.[] | select(.serving < .desired) | .name'
llmgw-cli models apply llama.yaml
```
""",
)


MODEL_COLUMNS = (
    Column("model", key=True),
    Column("rev"),
    Column("serving/desired", justify="right"),
    Column("phases"),
    Column("GPUs/replica", justify="right", drop=2),
    Column("engine", drop=1),
    Column("below its count because", wrap=True),
)


@models_app.default
def list_models(
    *,
    removed: Annotated[bool, Parameter(help="Include removed models.", negative=())] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Every declared model: replicas serving and desired, the bounds of those autoscaled
    (`auto 1..8`), and, when fewer serve than are desired, why in one phrase."""

    def show(client: AdminClient) -> int:
        params = {"include_removed": "true"} if removed else {}
        reply = call(client, list[ModelView], "GET", f"{ADMIN}/models", params=params)
        if output == "json":
            print_json(reply.raw)
            return EXIT_OK
        print_table(
            MODEL_COLUMNS,
            (
                (
                    m.name + (" (removed)" if m.removed else ""),
                    revision_text(m),
                    count_text(m),
                    ", ".join(f"{n} {phase}" for phase, n in m.phases.items()),
                    str(m.spec.gpus_per_shard * m.spec.shards_per_replica),
                    engine_text(m.spec.engine, m.spec.command),
                    shortfall_text(m),
                )
                for m in reply.value
            ),
            title=counted(len(reply.value), "model"),
            wide=output == "wide",
        )
        return EXIT_OK

    return run_command("models", connection, show)


@models_app.command(name="apply")
def apply_models(
    file: Annotated[
        Path,
        Parameter(
            help="A YAML or JSON model spec (or several: a list, or YAML documents separated "
            "by ---). Each needs a name.",
            converter=filled_path,
            validator=validators.Path(exists=True, dir_okay=False),
        ),
    ],
    /,
    *,
    dry_run: Annotated[
        bool,
        Parameter(
            help="Say what applying would do and record nothing: for each spec, whether it "
            "is new, unchanged, a change that takes effect at once, or a new revision that a "
            "rollout brings in, with every field that changes.",
            negative=(),
        ),
    ] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Declare models from a spec file. Applying the same spec again records nothing. Every
    spec of the file is checked by the server first: if any is invalid, the fields and why
    are shown (every value out of its bounds; a value of the wrong type or kind stops the
    check at that field) and none of the file is recorded. A file declares each model once.

    ```
    llmgw-cli models apply llama.yaml --dry-run   # what would change; nothing recorded
    llmgw-cli models apply llama.yaml
    ```

    where llama.yaml is

    ```
    name: llama-3-8b
    command: vllm serve meta-llama/Meta-Llama-3-8B --port {port}
    gpus_per_shard: 1
    gpu_memory_gib: 40
    replicas: 2
    ```
    """
    try:
        specs = read_specs(file)
    except SpecFileError as exc:
        print_error("models apply", str(exc))
        return EXIT_FAILED
    declared_by: dict[str, int] = {}
    for number, spec in enumerate(specs, 1):
        which = f"spec {number} in {file}" if len(specs) > 1 else str(file)
        name = spec.get("name")
        if not isinstance(name, str):
            print_error("models apply", f"{which}: name: is required (the model's name)")
            return EXIT_FAILED
        try:
            segment(name, "name")
        except UsageError as exc:
            print_error("models apply", f"{which}: {exc}")
            return EXIT_FAILED
        # Applied in turn, a second spec of a model would be a second revision of it, and
        # a rollout between the two, that no preview of the file could show.
        if name in declared_by:
            print_error(
                "models apply",
                f"{which}: model {name} is declared by spec {declared_by[name]} already; a "
                "file declares each model once",
            )
            return EXIT_FAILED
        declared_by[name] = number

    def apply(client: AdminClient) -> int:
        previews = [
            _preview(client, spec, number, specs, file) for number, spec in enumerate(specs, 1)
        ]
        if dry_run:
            report_previews(previews, output)
            return EXIT_OK
        replies: list[Reply[ModelChange]] = []
        for spec in specs:
            try:
                replies.append(put_model(client, spec))
            except ApiProblem:
                report_applied(replies, output)
                raise
        report_applied(replies, output)
        return EXIT_OK

    return run_command("models apply", connection, apply)


def _preview(
    client: AdminClient,
    spec: dict[str, object],
    number: int,
    specs: list[dict[str, object]],
    file: Path,
) -> Reply[ApplyPreview]:
    """The server's preview of one spec of the file; an invalid one names its place in the
    file and says that no spec of it was recorded."""
    try:
        return preview_model(client, spec)
    except ApiProblem as exc:
        if len(specs) == 1:
            raise
        raise ApiProblem(
            exc.status,
            f"spec {number} in {file}: {exc} (nor any other spec of the file)",
            exc.errors,
        ) from exc


PREVIEW_SAID = {
    "new": "new, would be declared at revision {revision}",
    "unchanged": "unchanged, nothing would be recorded",
    "at_once": "would change at once, revision {revision} stays",
    "new_revision": "would be revision {revision} (now {from_revision}): a rollout "
    "({rollout_id}) replaces its replicas with it",
    "declared_again": "removed, would be declared again at revision {revision}",
}


def report_previews(previews: list[Reply[ApplyPreview]], output: Output) -> None:
    if output == "json":
        print_json(b"[" + b",".join(reply.raw for reply in previews) + b"]")
        return
    for reply in previews:
        preview = reply.value
        template = PREVIEW_SAID.get(preview.outcome)
        # An outcome this client does not know is the server's word, shown as it is: never
        # a template (braces in it would be read as fields).
        said = (
            template.format_map(msgspec.structs.asdict(preview))
            if template is not None
            else preview.outcome
        )
        if preview.supersedes:
            said += f"; it supersedes {preview.supersedes}, under way now"
        say(f"model {preview.model}: {said}")
        for change in preview.revision_changes:
            say(f"  {change_text(change)}")
        if preview.at_once:
            say(f"  at once: {'; '.join(change_text(c) for c in preview.at_once)}")
    say("dry run: nothing was recorded")


def change_text(change: SpecFieldChange) -> str:
    """``replicas: 2 -> 3``; an unset value is ``(none)``."""
    return f"{change.field}: {change.old or '(none)'} -> {change.new or '(none)'}"


def report_applied(replies: list[Reply[ModelChange]], output: Output) -> None:
    """What applying each spec did, and the replicas a new revision leaves running the
    revision before until its rollout replaces them."""
    if output == "json":
        array = b"[" + b",".join(reply.raw for reply in replies) + b"]"
        print_json(array)
        return
    for reply in replies:
        model = reply.value.model
        said = "declared" if reply.value.changed else "unchanged, nothing recorded"
        # The first revision goes without saying; a later one is news to whoever applies.
        revision = f", revision {model.revision}" if model.revision > 1 else ""
        say(f"model {model.name}: {said}{revision}")
        if model.outdated:
            keep = "keeps" if len(model.outdated) == 1 else "keep"
            say(
                f"  {counted(len(model.outdated), 'replica')} placed with another revision "
                f"{keep} running it until replaced: {', '.join(model.outdated)}"
            )


def count_text(model: ModelView) -> str:
    """``5/8``, and an autoscaled model's bounds: ``5/8 (auto 1..8)``."""
    policy = model.spec.autoscale
    bounds = f" ({bounds_text(policy)})" if policy is not None else ""
    return f"{model.serving}/{model.desired}{bounds}"


def shortfall_text(model: ModelView) -> str:
    """Why fewer replicas serve than are desired, in one phrase (``llmgw-cli model`` gives
    every reason): ``wants 8, has 5: needs 1 node(s) with 2 healthy free GPU(s), ...`` when
    no node can take the rest, else the first reason the API gives; empty when none is
    short."""
    if model.serving >= model.desired or not model.below_desired_because:
        return ""
    if model.unplaceable_reason and model.counting < model.desired:
        return f"wants {model.desired}, has {model.counting}: {model.unplaceable_reason}"
    return model.below_desired_because[0]


def revision_text(model: ModelView) -> str:
    """The model's revision, and how many of its replicas run an older one: ``2 (1 old)``."""
    older = f" ({len(model.outdated)} old)" if model.outdated else ""
    return f"{model.revision}{older}"


def show_model(
    name: ModelName, /, *, output: Output = "table", connection: ConnectionFlags | None = None
) -> int:
    """One model: its spec, its replicas by phase, its autoscaling policy and the
    autoscaler's last decision with what it saw, and why it is below its count if it is.

    ```
    llmgw-cli model llama-3-8b
    ```
    """

    def path() -> str:
        return f"{ADMIN}/models/{segment(name, 'the model name')}"

    return show_one("model", path, ModelView, print_model, output, connection)


def scale(
    name: ModelName,
    replicas: Annotated[
        int,
        Parameter(
            help=f"How many replicas, 0 to {MAX_REPLICAS}.",
            converter=WholeNumberWithin(0, MAX_REPLICAS),
        ),
    ],
    /,
    *,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Change how many replicas of a model should serve.

    ```
    llmgw-cli scale llama-3-8b 4
    ```
    """

    return post_change(
        "scale",
        lambda: f"{ADMIN}/models/{segment(name, 'the model name')}/scale",
        ModelChange,
        {"replicas": replicas},
        output,
        connection,
        done=f"model {name}: scaled to {counted(replicas, 'replica')}",
        unchanged=f"model {name}: already at {replicas}, nothing recorded",
    )


def remove(
    name: ModelName, /, *, output: Output = "table", connection: ConnectionFlags | None = None
) -> int:
    """Remove a model: every replica of it is stopped. Its history stays in the log.

    ```
    llmgw-cli remove llama-3-8b
    ```
    """

    def change(client: AdminClient) -> int:
        path = f"{ADMIN}/models/{segment(name, 'the model name')}"
        reply = call(client, ModelChange, "DELETE", path)
        if output == "json":
            print_json(reply.raw)
        elif reply.value.changed:
            say(f"model {name}: removed; its replicas are being stopped")
        else:
            say(f"model {name}: already removed, nothing recorded")
        return EXIT_OK

    return run_command("remove", connection, change)


def print_model(model: ModelView, wide: bool = False) -> None:
    spec = model.spec
    memory = f"{spec.gpu_memory_gib:g} GiB free each" if spec.gpu_memory_gib else "any memory"
    facts: list[tuple[str, str | None]] = [
        ("model", model.name + (" (removed)" if model.removed else "")),
        ("serving", f"{model.serving} of {model.desired} desired ({model.counting} counting)"),
        ("phases", ", ".join(f"{n} {phase}" for phase, n in model.phases.items())),
        ("revision", str(model.revision)),
        ("engine", engine_text(spec.engine, spec.command)),
        ("command", spec.command),
        ("shape", f"{spec.shards_per_replica} shard(s) x {spec.gpus_per_shard} GPU(s), {memory}"),
        ("selector", ",".join(f"{k}={v}" for k, v in sorted(spec.node_selector.items()))),
        ("startup", f"times out after {spec.startup_timeout_s:g}s"),
        ("routing", routing_text(spec.routing)),
        ("apis", ", ".join(spec.apis)),
    ]
    if model.failures:
        facts.append(("failures", str(model.failures)))
    if model.backoff_until is not None:
        facts.append(("backoff", f"until {utc_seconds(model.backoff_until)} UTC"))
    if model.unplaceable_reason:
        facts.append(("unplaceable", model.unplaceable_reason))
    facts.extend(_autoscale_facts(model))
    rollout = model.rollout
    if rollout is not None and rollout.state in UNDER_WAY:
        facts.append(
            (
                "rollout",
                f"{rollout.rollout_id} {rollout.state.replace('_', ' ')}, revision "
                f"{rollout.from_revision} -> {rollout.revision}, step {rollout.step + 1} of "
                f"{rollout.steps} (llmgw-cli rollout status {model.name})",
            )
        )
    elif rollout is not None:
        # A state this client does not know yet is shown as the API spells it.
        ended = f"{rollout.rollout_id} {rollout.state.replace('_', ' ')}"
        facts.append(("last rollout", f"{ended}: {rollout.outcome}" if rollout.outcome else ended))
    if model.outdated:
        facts.append(
            (
                "older",
                f"{', '.join(model.outdated)} run(s) another revision until replaced "
                "(llmgw-cli history model shows what changed)",
            )
        )
    console = make_console()
    print_facts(facts, console)
    for reason in model.below_desired_because:
        console.print(text(f"below its count: {reason}"))
    for reason in model.waiting_to_move:
        console.print(text(reason))
    if model.traffic_by_revision is not None:
        print_traffic_by_revision(model.traffic_by_revision, console)


def routing_text(routing: RoutingView) -> str:
    """``prefix (load factor 0.25, key 1024 bytes)``; ``least_loaded`` alone; either with
    ``, at most N in flight per replica from each gateway`` when the model bounds it."""
    bound = (
        ""
        if routing.max_in_flight is None
        else f", at most {routing.max_in_flight} in flight per replica from each gateway"
    )
    if routing.policy == "least_loaded":
        return routing.policy + bound
    knobs = [f"load factor {routing.load_factor:g}", f"key {routing.prefix_bytes} bytes"]
    if routing.policy == "session":
        knobs.append(f"session key from {', '.join(routing.session_keys) or 'nothing'}")
    return f"{routing.policy} ({', '.join(knobs)}){bound}"


def _autoscale_facts(model: ModelView) -> list[tuple[str, str | None]]:
    """The policy, and the autoscaler's last change of the count with what it saw."""
    policy, last = model.spec.autoscale, model.last_autoscale
    facts: list[tuple[str, str | None]] = [
        ("autoscale", policy_text(policy) if policy is not None else "off"),
    ]
    if last is not None:
        facts.append(("last scaled", decision_text(last)))
        seen = inputs_text(last)
        if seen is not None:
            facts.append(("it saw", seen))
    return facts


def engine_text(engine: str, command: str) -> str:
    """The declared engine, with the program the command runs when that is not the engine
    itself: the dev cluster's ``demo`` reads ``llmgw-sim-engine (vllm-compatible)``."""
    program = program_of(command)
    profile = PROFILES.get(engine)
    runs_it = profile is not None and program.lower() in profile.programs
    return engine if runs_it else f"{program} ({engine}-compatible)"


def program_of(command: str) -> str:
    """The program a command template runs: past a leading ``env`` and ``NAME=value``s, a
    path's last part, and for ``python -m`` the module's package."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the spec was accepted, show what is there
        words = command.split()
    words = list(dropwhile(lambda word: word == "env" or "=" in word, words)) or [command]
    program = PurePosixPath(words[0]).name
    if program.startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
        return words[2].split(".")[0]
    return program
