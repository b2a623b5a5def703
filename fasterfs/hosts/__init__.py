"""Hosts and their processes: Ray nodes, and the lab's share-nothing hosts (network, disks, faults)."""
