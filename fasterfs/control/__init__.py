"""What names, finds and unlocks the cluster: its state, keys, TLS, S3 clients, node ids, the Registry."""
