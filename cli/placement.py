"""`llmgw-cli explain-placement <model> | --spec FILE`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import Parameter, validators

from cli.arguments import filled_path, segment
from cli.client import ADMIN, AdminClient
from cli.config import ConnectionFlags
from cli.operator import Output, Reply, call, print_reply, run_command
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Column,
    make_console,
    print_error,
    print_table,
    styled,
    text,
)
from cli.spec_file import SpecFileError, read_specs
from cli.views import CandidateView, PlacementView


def explain_placement(
    model: Annotated[str | None, Parameter(help="A declared model.")] = None,
    /,
    *,
    spec: Annotated[
        Path | None,
        Parameter(
            help="Explain a spec that is only being tried (YAML or JSON); nothing is recorded.",
            converter=filled_path,
            validator=validators.Path(exists=True, dir_okay=False),
        ),
    ] = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Where one more replica would go, and the exact reason every other node would not
    take it: not connected, cordoned or draining, too few healthy free GPUs (and which GPU
    is unhealthy and why), labels that do not match, no free port. When the model's
    replicas failed on some node since one last served, a `failed here` column counts them
    per node: placement ranks such a node after those with fewer.

    ```
    llmgw-cli explain-placement llama-3-8b
    llmgw-cli explain-placement --spec qwen-72b.yaml
    ```
    """
    if (model is None) == (spec is None):
        print_error("explain-placement", "give a model name or --spec FILE (one of the two)")
        return EXIT_USAGE
    body = None
    if spec is not None:
        try:
            specs = read_specs(spec)
        except SpecFileError as exc:
            print_error("explain-placement", str(exc))
            return EXIT_FAILED
        if len(specs) != 1:
            print_error("explain-placement", f"{spec} holds {len(specs)} specs; give one")
            return EXIT_FAILED
        body = specs[0]

    def explain(client: AdminClient) -> int:
        print_reply(_ask(client, model, body), output, print_placement)
        return EXIT_OK

    return run_command("explain-placement", connection, explain)


def _ask(client: AdminClient, model: str | None, spec: object) -> Reply[PlacementView]:
    if model is not None:
        return call(
            client,
            PlacementView,
            "GET",
            f"{ADMIN}/models/{segment(model, 'the model name')}/placement",
        )
    return call(client, PlacementView, "POST", f"{ADMIN}/placement", body=spec)


CANDIDATE_COLUMNS = (
    Column("node", key=True),
    Column("eligible"),
    Column("usable GPUs", justify="right", drop=2),
    Column("replicas of it", justify="right", drop=3),
    Column("would use", drop=1),
    Column("why not", wrap=True),
)

FAILURES_COLUMN = Column("failed here", justify="right", drop=4)
"""The model's replicas that failed on the node since one of them last served: placement
ranks such a node after those with fewer."""


def candidate_columns(placement: PlacementView) -> tuple[Column, ...]:
    """The candidates' columns, ``failed here`` too when the model failed on some node:
    a column of zeros would only crowd out the reasons."""
    if any(c.failures_here for c in placement.candidates):
        return (*CANDIDATE_COLUMNS, FAILURES_COLUMN)
    return CANDIDATE_COLUMNS


def candidate_row(candidate: CandidateView) -> tuple[str, ...]:
    return (
        candidate.node_id,
        "yes" if candidate.eligible else "no",
        str(candidate.usable_gpus),
        str(candidate.same_model_replicas),
        # A node that cannot take the shard would use nothing: the GPUs it has free are
        # too few, or the node is not to be used at all.
        _would_use(candidate.gpus, candidate.port, candidate.ports_skipped)
        if candidate.eligible
        else "",
        "; ".join(candidate.reasons),
        str(candidate.failures_here),
    )


def print_placement(placement: PlacementView, wide: bool = False) -> None:
    console = make_console()
    verdict = ("placeable", "green") if placement.placeable else ("not placeable", "red")
    console.print(styled((f"{placement.model}: ", "bold"), verdict))
    console.print(text(placement.summary), soft_wrap=True)
    columns = candidate_columns(placement)
    print_table(
        columns,
        (candidate_row(c)[: len(columns)] for c in placement.candidates),
        console=console,
        wide=wide,
    )


def _would_use(gpus: list[int], port: int | None, skipped: list[int]) -> str:
    if not gpus:
        return ""
    used = f"GPUs {','.join(str(g) for g in gpus)}"
    if port is None:
        return used
    held = f" ({', '.join(map(str, skipped))} held by another process)" if skipped else ""
    return f"{used}, port {port}{held}"
