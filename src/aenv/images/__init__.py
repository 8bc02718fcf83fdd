"""The images plane: OCI references, registry pulls into a shared layer cache, and images
turned into template root filesystems."""
