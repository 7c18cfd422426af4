"""The suite behind docs/BENCHMARKS.md: attnserve against what a user would run instead.

Not installed with attnserve: it runs from a checkout (`make benchmarks`, or
`python -m perf NAME`), because it needs what only the repository has: the compose
file and Dockerfile, docs/, the peers' own environment (.venv-peers) and tools (.tools).
What a user points at their own model or deployment is installed: `attnserve bench`.
"""
