"""The cluster plane: etcd (`etcd.py`), node membership (`membership.py`); later the gateway
and placement."""
