"""What every HTTP listener of llmgw shares, before a request reaches an app:
limits on slow and greedy clients (``limits``) and the budget of failed authentications
per client address (``throttle``), counted by token buckets (``buckets``, which the agent
hub counts by too)."""
