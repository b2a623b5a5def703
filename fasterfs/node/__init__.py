"""A storage host's StorageNode and the plain components it wires: MinIO, kernel, cache, peers, repair, mounts."""
