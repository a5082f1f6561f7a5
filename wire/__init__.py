"""The agent channel's language, spoken by the control plane (``app.hub``) and the agent
(``agent``) alike: its messages, their codec and limits, its close codes and its errors.

A package of its own rather than a module of either program: both sides import it and
neither owns it, so a change to the wire shows as a change to this package alone.
"""
