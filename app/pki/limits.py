"""How much of a certificate or key file is read, in a module of its own: ``llmgw-cli``
checks the files its settings name against it at every start, without loading
``cryptography`` for a command that speaks plain http."""

from __future__ import annotations

MAX_PEM_FILE_BYTES = 512 * 1024
"""The largest certificate or key file read: a chain of certificates is a few KiB each."""
