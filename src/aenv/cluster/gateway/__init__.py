"""`aenv gateway` (docs/cluster.md): the whole E2B API of a cluster on one origin.

- `routing.py`: what a request is for (a sandbox's data plane, one sandbox, a create, a
  listing, a template), decided from its method, path and headers alone;
- `nodes.py`: calling nodes (one, or all at once);
- `lists.py`: listings merged over every node, with cursors that stay stable;
- `app.py`: the ASGI application: membership and bindings watched in etcd, placement on
  create, and the relay to the owning node.
"""
