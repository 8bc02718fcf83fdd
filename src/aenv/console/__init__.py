"""The web console: static pages a browser runs against the node's (or a gateway's) E2B API
with the key the user types, served on an origin of their own (docs/console.md)."""
