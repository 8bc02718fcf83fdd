"""The snapshot store (docs/cluster.md, "Snapshot store"): snapshots, templates and paused
sandboxes published to an object store, S3-compatible or a shared filesystem, so that any
node can restore them.

- `objects.py`: the stores themselves (`S3Objects` through boto3 with an endpoint URL,
  `FsObjects` on a shared directory), one small interface;
- `published.py`: what a published snapshot is (its files as lists of chunk digests, its
  manifest, what a node must match to restore it);
- `transfer.py`: publish and fetch, chunk by chunk: content-addressed, checksummed, zero
  chunks never sent, chunks the store or the fetching node already has never moved.
"""
