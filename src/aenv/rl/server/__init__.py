"""The node's RL plane (`/rl/...`): groups, leases, evaluations. The client side is
`aenv.rl` itself, which imports nothing of this package."""
