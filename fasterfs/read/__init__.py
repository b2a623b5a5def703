"""Readers, in any process: sessions, clients, the namespace by path, the mount's agent, fsspec, Ray Data."""
