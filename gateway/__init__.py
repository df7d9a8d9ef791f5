"""The OpenAI-compatible gateway: a raw ASGI app (no framework in the hot
path) that authenticates, admits, routes and proxies to vLLM replicas, and
hands every completed request to the record sink."""
