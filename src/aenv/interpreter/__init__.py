"""aenv's code interpreter server: what E2B's code interpreter SDKs call on port 49999 of a
sandbox (`e2b-code-interpreter`, `@e2b/code-interpreter`), written from their protocol.

It runs in the guest of the `code-interpreter-v1` template, beside the agent, in front of
Jupyter kernels that it starts itself with `jupyter_client` (no Jupyter Server: one process
less, and nothing listening but this server). A plane of its own, not part of `guest/`: the
template carries it, so the agent's tools drive (hashed into every template's key) does not
change with it.

- `languages.py`: language names, kernel specs, the code that sets and restores env vars.
- `results.py`: a kernel's output messages as the stream's lines.
- `contexts.py`: contexts (a kernel, its client and its lock), made, listed, restarted,
  removed; the default ones made before the server reports healthy.
- `execution.py`: one run of code in a context, as NDJSON lines, with keepalives; the kernel
  interrupted when the client leaves.
- `app.py`: the routes (Starlette); `__main__.py` serves them with uvicorn.

Port 49999 has no authentication of its own, as in E2B: a sandbox's traffic token
(`allowPublicTraffic: false`) is what guards it, checked by the node's proxy.
"""
