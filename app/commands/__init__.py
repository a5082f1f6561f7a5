"""The commands of ``llmgw-server``, one module each; ``app.main`` assembles them."""
