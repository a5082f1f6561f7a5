"""llmgw's private CA: ECDSA P-256 certificates for the agent channel and the admin API.

Pure building (`builders`, `describe`, `explain`) takes keys and the clock as
arguments; `files` and `tls` are the edges that touch the disk and sockets. The
exception tree is drawn in `app.pki.errors`.

Callers import from the module that defines a name: the package re-exports nothing, so
importing ``app.pki.errors`` (what ``llmgw-cli`` needs to tell a TLS failure) does not
load the ``cryptography`` builders behind every other module.
"""
