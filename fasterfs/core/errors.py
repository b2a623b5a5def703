"""The one exception type FasterFS raises for problems a user can fix.

Messages name the file, key, port or option at fault; the CLI prints them
without a traceback.
"""


class FasterFSError(Exception):
    """A problem with input, configuration or cluster state, explained for the user."""


class ConfigError(FasterFSError):
    """A bad override or configuration value: command lines exit with 2 on it, as argparse does."""


class UsageError(ConfigError):
    """A command-line argument that parsed but names nothing there (a chunk, a lab host): the
    CLI reports it as argparse does, naming the argument, with exit code 2."""


class HeadUnreachable(FasterFSError):
    """Nothing answers at the head's Ray address: a reader may go on with this host's copy of the
    namespace (fasterfs.read.head_link.without_head)."""
