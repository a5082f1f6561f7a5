"""``llmgw-server serve``: the control plane, its admin API and its gateway."""

from __future__ import annotations

import asyncio
import sys

from app.bootstrap import Server, SettingsError
from app.commands.common import SERVE, refuse_usage
from app.logs import configure_logging
from app.settings import ServeSettings


def serve(settings: ServeSettings) -> None:
    """Run the control plane until SIGINT or SIGTERM: the admin API and the gateway (on
    its own client listener, never serving the admin API) always; the agent hub and the
    reconciler while this server is the elected leader.

    Several servers may run against one database: one leads, the others stand by and take
    over within seconds when it goes. A server that loses leadership exits with code 3.

    With --admin-tls-cert and --admin-tls-key the admin API is served over HTTPS, and an
    operator certificate from the llmgw CA (`llmgw-cli cert operator <name>`) authenticates
    its holder, whose name then becomes the actor of what they change.

    Engines are contacted only where --engine-networks allows.
    The database role must be the runtime role (`llmgw-server migrate --runtime-role`),
    which appends only through llmgw_append and owns nothing: a superuser, or the owner of
    the log's tables, is refused unless --allow-privileged-role is given.

    Exit codes: 0 after SIGINT or SIGTERM; 1 when it cannot start (a listener's address in
    use, the database unreachable, not migrated or refusing its role) or a listener stops by
    itself, said in one line on stderr; 2 bad usage; 3 it lost leadership.

    Example: llmgw-server serve --tls-cert server.crt --tls-key server.key --tls-ca ca.crt
    """
    configure_logging(settings.log_level, command=SERVE)
    try:
        server = Server.from_settings(settings)
    except SettingsError as exc:
        refuse_usage(SERVE, str(exc))
    sys.exit(asyncio.run(server.run()))
