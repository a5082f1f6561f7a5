"""What ``llmgw-dev`` prints once the cluster is up: where everything is, and commands that
work exactly as printed."""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from devcluster.processes import program

CHAT_BODY = '{"model": "demo", "messages": [{"role": "user", "content": "Hello!"}]}'


@dataclass(frozen=True)
class Where:
    state_dir: Path
    gateway_url: str
    admin_url: str
    agent_uri: str
    nodes: tuple[str, ...]
    fake_gpus: str
    model: str
    served_by: str
    database_url: str | None
    """The PostgreSQL started here, as its superuser (no password); None when it is the
    operator's ``LLMGW_DATABASE_URL``, which is never printed (it may hold a password)."""


def next_steps(where: Where, token: str, api_key: str, logs: dict[str, Path]) -> str:
    cli = _as_typed("llmgw-cli")
    python = "python" if shutil.which("python") == sys.executable else sys.executable
    log_lines = "\n".join(f"  {name:<12} {path}" for name, path in logs.items())
    curl = shlex.join(
        [
            "curl",
            f"{where.gateway_url}/chat/completions",
            *("-H", f"Authorization: Bearer {api_key}"),
            *("-H", "Content-Type: application/json", "-d", CHAT_BODY),
        ]
    )
    state_dir = where.state_dir
    if where.database_url is None:
        database = "from LLMGW_DATABASE_URL (the server connects as llmgw_runtime)"
        log_verify = ""
    else:
        database = f"{where.database_url} (superuser; the server connects as llmgw_runtime)"
        server = _as_typed("llmgw-server")
        log_verify = f"\n  LLMGW_DATABASE_URL={where.database_url} {server} log verify"
    return f"""\
llmgw dev cluster is up: state in {state_dir}
  gateway      {where.gateway_url} (OpenAI-compatible; API key in {state_dir / "api-key"})
  admin API    {where.admin_url} (token in {state_dir / "admin-token"})
  agent hub    {where.agent_uri}
  nodes        {", ".join(where.nodes)} ({where.fake_gpus} fake GPUs each)
  model        {where.model}, served by {where.served_by}
  database     {database}
logs:
{log_lines}

Next steps, in another shell:
  export LLMGW_ADMIN_URL={where.admin_url} LLMGW_ADMIN_TOKEN={token}
  {cli} history model {where.model}{log_verify}
  {curl}
Or with the openai SDK:
{shlex.quote(python)} - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{where.gateway_url}", api_key="{api_key}")
reply = client.chat.completions.create(
    model="{where.model}", messages=[{{"role": "user", "content": "Hello!"}}]
)
print(reply.choices[0].message.content)
PY
Press Ctrl-C to stop every process started here; the next run reuses {state_dir}.
"""


def _as_typed(name: str) -> str:
    """``name`` where the shell finds the installed program by it, else its full path."""
    installed = program(name)
    return name if shutil.which(name) == installed else installed
