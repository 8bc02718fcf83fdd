"""The cluster plane (docs/cluster.md): etcd (`etcd.py`), node membership (`membership.py`,
`node.py`), placement (`placement.py`) and the nodes' own bindings (`bindings.py`); the
gateway is next."""
