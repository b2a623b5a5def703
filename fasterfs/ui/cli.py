"""The `fasterfs` command. Every subcommand takes Hydra overrides, e.g.
`fasterfs up nodes=4`, `fasterfs ingest data.rows_per_chunk=500 replicas=2`."""
from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console

from ..control import report
from ..control.state import joined, leave
from ..core import config
from ..core.errors import ConfigError, FasterFSError, UsageError
from .cli_cluster import (
    chunk_list,
    cmd_cache_clear,
    cmd_cache_status,
    cmd_cache_warm,
    cmd_down,
    cmd_env,
    cmd_kernel_status,
    cmd_mount,
    cmd_notebook,
    cmd_repair,
    cmd_status,
    cmd_umount,
    cmd_up,
)
from .cli_data import cmd_cat, cmd_import, cmd_ingest, cmd_ls, cmd_put, cmd_rm
from .cli_lab import (
    cmd_lab_add_host,
    cmd_lab_down,
    cmd_lab_exec,
    cmd_lab_fill,
    cmd_lab_flip,
    cmd_lab_freeze,
    cmd_lab_heal,
    cmd_lab_partition,
    cmd_lab_power_off,
    cmd_lab_power_on,
    cmd_lab_slow,
    cmd_lab_thaw,
    cmd_lab_up,
    host_or_head,
    peer_list,
)
from .cli_nodes import cmd_nodes_add, cmd_nodes_drain, cmd_nodes_restart, how_many

console = report.console()


@dataclass(frozen=True)
class Command:
    run: Callable
    help: str     # one line, in `fasterfs --help`'s list
    example: str
    args: tuple[tuple[str, dict], ...] = ()  # positional arguments: (name, argparse keywords)
    flags: tuple[tuple[str, dict], ...] = ()
    about: str = ""  # the whole story, where one line is not enough: `fasterfs CMD --help`, docs/commands.md


NODE = ("node", dict(type=int, metavar="NODE", help="a lab host's node id (0, 1, ...)"))
HOST = ("node", dict(type=host_or_head, metavar="NODE", help="a lab host's node id (0, 1, ...), or head"))
COUNT = ("count", dict(type=how_many, nargs="?", default=1, metavar="COUNT",
                       help="how many join in this one step (default 1): each piece moves at most once"))
COMMANDS = {
    "up": Command(cmd_up, "start a local cluster: N Ray nodes, each with a StorageNode and its MinIO",
                  "fasterfs up nodes=4",
                  about=("start a local cluster: N Ray nodes (each with its own loopback address, object"
                         " store, StorageNode actor and MinIO), the Registry actor and the dashboard on "
                         "the head; with `cluster.attach=true`, StorageNodes on a Ray cluster started "
                         "elsewhere. On a head whose GCS or machine went away: starts it again and "
                         "adopts the hosts that ran on; on a head that lost its disk: rebuilds the "
                         "namespace and keys from the hosts' copies (docs/failures.md#the-head-can-die)")),
    "status": Command(cmd_status, "show each node's Ray id, MinIO endpoint, health, contents and mounts",
                      "fasterfs status cluster.ray_address=127.0.0.2:6379",
                      about=("each node's Ray id, MinIO endpoint, health, objects and bytes the "
                             "namespace places there, the last MinIO listing's count and age, mounts, "
                             "how far each host's namespace replica reaches; the dashboard's and "
                             "notebook's URLs, the token's file; a `Redundancy:` line (chunks at full "
                             "redundancy, degraded, lost by name, nodes down; waits 10 s at most for the"
                             " survey); works from any host with `cluster.ray_address=<head>:<port>`")),
    "env": Command(cmd_env, "print the shell lines that let Ray's own tools (`ray job submit`) drive this cluster",
                   'eval "$(.venv/bin/fasterfs env)"; ray job submit --working-dir . -- python jobs/graysort.py',
                   about=("print the `export` lines that let Ray's own tools (`ray job submit`) drive "
                          "this cluster: `RAY_ADDRESS`, `RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN_PATH` "
                          "(the token's file, never the token), `FASTERFS_CLUSTER`, `FASTERFS_ROOT`, "
                          "`.venv/bin` first on `PATH`")),
    "ingest": Command(cmd_ingest, "check a LOBSTER pair, cut it into chunks and store them on their nodes",
                      "fasterfs ingest data.rows_per_chunk=500 replicas=2",
                      about=("check a LOBSTER message/order-book pair, cut it into chunks, place each by"
                             " rendezvous hashing and store it in the owning nodes' MinIO; publish the "
                             "dataset's manifest last, atomically (replacing only a dataset of the same "
                             "name)")),
    "down": Command(cmd_down, "stop everything the cluster started", "fasterfs down",
                    about=("stop everything the cluster started: the actors (each stops its MinIO), the "
                           "mounts, JupyterLab, the Redis server, the `ray start` processes, whatever "
                           "else is in the cluster's cgroup; removes the TC filters, pins, bpffs, "
                           "cgroups and spill directory")),
    "nodes add": Command(cmd_nodes_add, "add nodes to the running cluster: their Ray nodes, StorageNodes and MinIO; "
                         "their share of the data moves to them in the background", "fasterfs nodes add 2", (COUNT,),
                         about=("add COUNT nodes to the running cluster on the next loopback addresses: each "
                                "its Ray node, StorageNode (MinIO, kernel programs, cache); every name is then "
                                "placed over every node, and the repair leader moves the pieces rendezvous "
                                "gives the new nodes in the background at repair.mb_per_s, each "
                                "read and checked before the namespace names its new home, the old copy "
                                "serving until then; `fasterfs status` shows what is left to move. On a "
                                "cluster attached to a Ray cluster started elsewhere (cluster.yaml), a "
                                "StorageNode on each Ray node that joined it since instead (docs/multi-host.md)")),
    "nodes drain": Command(cmd_nodes_drain, "move a node's data to the others, then stop it and take it out of the "
                           "cluster", "fasterfs nodes drain 3 repair.drain_mb_per_s=50",
                           (("node", dict(type=int, metavar="NODE", help="the node's id (0, 1, ...)")),),
                           about=("move a node's data to the others, then stop it: the node takes no new "
                                  "data, repair moves each of its pieces to the node placement now gives it "
                                  "(read and checked, the namespace naming the new home before the old copy "
                                  "is retired: full redundancy throughout), and once the namespace names "
                                  "nothing on it its StorageNode, MinIO and Ray node (not one of a Ray "
                                  "cluster started elsewhere: its owner's) stop and it leaves the cluster's state. "
                                  "Its moves go at repair.drain_mb_per_s on every node (the "
                                  "readers share the disks with them). Refused, naming why, when a name's "
                                  "layout needs more nodes than would be left (docs/multi-host.md)")),
    "nodes restart": Command(cmd_nodes_restart, "start each StorageNode again in turn, with the code installed now and "
                             "the settings given", "fasterfs nodes restart cache.capacity_mb=2048",
                             (("nodes", dict(type=int, nargs="*", metavar="NODE",
                                             help="the nodes' ids (default: every node)")),),
                             about=("start each StorageNode again, one after the other, with the code installed "
                                    "now and the options given (key=value) over the cluster's: the old one "
                                    "hands its MinIO and its mounts' daemons to the new one, which serve on "
                                    "throughout, so no read fails; the next node restarts once this one has "
                                    "caught up with the namespace. An option `up` fixed (cluster.*, MinIO's "
                                    "ports, bucket and TLS, the layout) is refused, nothing restarted "
                                    "(docs/multi-host.md)")),
    "notebook": Command(cmd_notebook, "start JupyterLab on the head's address (notebooks/, kernels that can "
                        "fasterfs.connect())", "fasterfs notebook"),
    "cache status": Command(cmd_cache_status, "each node's cache: entries, size, hits, misses, fills, evictions",
                            "fasterfs cache status"),
    "cache warm": Command(cmd_cache_warm, "fill the caches with chunks of the dataset ingested last, now",
                          "fasterfs cache warm 0-9,20",
                          (("chunks", dict(nargs="?", type=chunk_list, metavar="CHUNKS",
                                           help="chunk ids: 'all' (the default), 5, 0-9 or 0-9,20,30-31")),)),
    "cache clear": Command(cmd_cache_clear, "empty every node's cache and start a new kernel epoch",
                           "fasterfs cache clear"),
    "lab up": Command(cmd_lab_up, "create N hosts as network and mount namespaces with bandwidth limits and "
                      "start the cluster on them", "fasterfs lab up --nodes 4 lab=laptops"),
    "lab down": Command(cmd_lab_down, "stop the lab's cluster and remove its namespaces, links, bridge and qdiscs",
                        "fasterfs lab down",
                        about=("stop the lab's cluster and remove its namespaces, links, bridge and "
                               "qdiscs (the disks stay)")),
    "lab exec": Command(cmd_lab_exec, "run a command on a lab host, as on that machine (its own files and network)",
                        "fasterfs lab exec 1 -- fasterfs status cluster.ray_address=198.18.0.1:6391",
                        (NODE, ("command", dict(nargs="+", metavar="COMMAND",
                                                help="the command and its arguments, after --")))),
    "lab add-host": Command(cmd_lab_add_host, "machines join the running lab: hosts of their own, then `nodes add` "
                            "on them", "fasterfs lab add-host 2", (COUNT,)),
    "lab power-off": Command(cmd_lab_power_off, "kill every process of a lab host at once, as a machine losing "
                             "power (head: the head's)", "fasterfs lab power-off 2", (HOST,)),
    "lab power-on": Command(cmd_lab_power_on, "start a powered-off lab host again (head: the head, adopting the "
                            "hosts that ran on)", "fasterfs lab power-on 2 --empty", (HOST,),
                            (("--empty", dict(action="store_true", help="with a blank disk, as a replaced machine")),)),
    "lab partition": Command(cmd_lab_partition, "cut a lab host off from others (both ways, or --one-way: it cannot "
                             "reach them, they still reach it)", "fasterfs lab partition 0 1,2",
                             (NODE, ("peers", dict(type=peer_list, metavar="PEERS",
                                                   help="host ids and/or 'head', comma-separated: 1,2 or head"))),
                             (("--one-way", dict(action="store_true",
                                                 help="only NODE's connections to PEERS fail")),)),
    "lab heal": Command(cmd_lab_heal, "undo every partition, slow link and full disk of the lab", "fasterfs lab heal"),
    "lab freeze": Command(cmd_lab_freeze, "SIGSTOP a lab host's MinIO or StorageNode: alive, never answering",
                          "fasterfs lab freeze 1 minio", (NODE, ("what", dict(choices=["minio", "storage-node"],
                                                                             metavar="WHAT",
                                                                             help="minio or storage-node"))),
                          about=("SIGSTOP a lab host's MinIO or StorageNode by PID: connections "
                                 "accepted, nothing answered")),
    "lab thaw": Command(cmd_lab_thaw, "SIGCONT what `lab freeze` stopped on a host", "fasterfs lab thaw 1",
                        (NODE, ("what", dict(nargs="?", choices=["minio", "storage-node"], metavar="WHAT",
                                             help="minio or storage-node (default: both)"))),
                        about=("SIGCONT what `lab freeze` stopped (only the process frozen: PID and "
                               "start time)")),
    "lab slow": Command(cmd_lab_slow, "limit a lab host's link to N Mbit/s (until `lab heal`)",
                        "fasterfs lab slow 2 --mbit 2", (NODE,),
                        (("--mbit", dict(type=float, required=True, metavar="N", help="the link's rate")),)),
    "lab fill": Command(cmd_lab_fill, "fill a lab host's disk (a lab started with lab.disk_mb=N) until `lab heal`",
                        "fasterfs lab fill 1 --leave-mb 0", (NODE,),
                        (("--leave-mb", dict(type=float, default=0, metavar="MB", help="free space to leave")),)),
    "lab flip": Command(cmd_lab_flip, "flip a byte in files of a lab host's disk, as bit rot would",
                        "fasterfs lab flip 1 minio --count 3",
                        (NODE, ("where", dict(choices=["minio", "cache"], metavar="WHERE",
                                              help="minio (its object files) or cache (its entries)"))),
                        (("--count", dict(type=int, default=1, metavar="N", help="files to flip a byte in (0: all)")),
                         ("--seed", dict(type=int, default=0, metavar="S", help="which files and bytes")))),
    "put": Command(cmd_put, "store local files in the namespace (DEST ending in '/', or several LOCALs: a directory)",
                   "fasterfs put -r ~/taq/2024 taq/2024/",
                   (("sources", dict(nargs="+", metavar="LOCAL", help="local files (with -r: directories) to store")),
                    ("dest", dict(metavar="DEST", help="their path in the namespace"))),
                   (("--force", dict(action="store_true", help="replace a file of the same name")),
                    ("-r", dict(action="store_true", dest="recursive",
                                help="store each directory's whole tree, in batches (a rerun resumes)"))),
                   about=("store local files in the namespace, as `files.chunk_mb` chunks placed and "
                          "replicated like a dataset's (DEST ending in `/`, or several LOCALs: a "
                          "directory)")),
    "import": Command(cmd_import, "copy every object under an S3 prefix of another store into the namespace, in "
                      "batches, as Ray tasks (keys: --keys FILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
                      "fasterfs import s3://team-data/taq/2024/ taq/2024/ --endpoint http://s3.example:9000",
                      (("source", dict(metavar="S3_URL", help="s3://BUCKET/PREFIX")),
                       ("dest", dict(metavar="DEST", help="the directory of the namespace it goes in"))),
                      (("--endpoint", dict(required=True, metavar="URL", help="the source store's S3 endpoint")),
                       ("--keys", dict(metavar="FILE", help="JSON {access_key, secret_key}, mode 0600")),
                       ("--force", dict(action="store_true", help="replace files of the same names"))),
                      about=("copy every object under an S3 prefix of another store into a directory of "
                             "the namespace, in batches, as Ray tasks on the nodes (keys from `--keys` "
                             "or `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, never the command line)")),
    "ls": Command(cmd_ls, "list the namespace: datasets, their chunks, stored files", "fasterfs ls research/",
                  (("path", dict(nargs="?", default="", metavar="PATH",
                                 help="a directory or file of the namespace (default: its top)")),)),
    "cat": Command(cmd_cat, "write a dataset's or file's bytes to stdout", "fasterfs cat research/book.parquet > b.pq",
                   (("path", dict(metavar="PATH", help="a file of the namespace")),)),
    "rm": Command(cmd_rm, "remove datasets or files from the namespace", "fasterfs rm research/book.parquet",
                  (("names", dict(nargs="+", metavar="NAME", help="a dataset's name or a file's path")),),
                  about=("remove datasets or files from the namespace (readers holding them keep them "
                         "for `ingest.keep_old_s`)")),
    "mount": Command(cmd_mount, "mount the namespace read-only with FUSE on every host", "fasterfs mount /mnt/ffs",
                     (("mountpoint", dict(metavar="MOUNTPOINT",
                                          help="an absolute path to an empty directory, the same on every host")),),
                     about=("mount the namespace read-only with FUSE on every host, with the `mount.*` "
                            "options `up` had (docs/namespace-and-mount.md#the-mount)")),
    "umount": Command(cmd_umount, "unmount it on every host", "fasterfs umount /mnt/ffs",
                      (("mountpoint", dict(metavar="MOUNTPOINT", help="the path given to `fasterfs mount`")),)),
    "repair": Command(cmd_repair, "put every missing replica or shard back (and pieces moved away back home); names "
                      "chunks that are lost", "fasterfs repair repair.mb_per_s=50",
                      about=("put every missing replica or shard back (and pieces moved away back home);"
                             " names chunks that are lost and then exits 1 (docs/failures.md#repair)")),
    "kernel status": Command(cmd_kernel_status, "what each node's eBPF programs have seen: requests, hot keys, "
                             "latency, tuning", "fasterfs kernel status",
                             about=("what each node's eBPF programs have seen: mode, requests, HOT "
                                    "events (emitted and received), stale marks, filler GETs skipped, "
                                    "latency (avg, p50 bucket, histogram), connections tuned and option "
                                    "failures, requests MinIO refused, suspect marks, the hottest keys "
                                    "resolved to chunk names (docs/kernel.md)")),
}

OVERRIDES_RULE = """overrides: KEY=VALUE words whose KEY starts with a top-level option of conf/config.yaml
(nodes=4, cluster.root=/data/ffs, data=synthetic, +x=1, ~x) are Hydra overrides, in any place;
every other word is an argument. After `--` every word is an argument (fasterfs ls -- nodes=1.csv)."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (naming the argument) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = Parser(prog="fasterfs", description=__doc__, epilog=OVERRIDES_RULE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log details and show tracebacks")
    # dests of their own: a command's arguments (lab exec's COMMAND) must not overwrite them
    sub = parser.add_subparsers(dest="_command", required=True, metavar="COMMAND",
                                parser_class=Parser)
    groups: dict[str, argparse._SubParsersAction] = {}
    parsers = {}
    for name, c in COMMANDS.items():
        kw: dict[str, Any] = dict(help=c.help, description=textwrap.fill(c.about or c.help, 100),
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=f"example:\n  {c.example}\n\n{OVERRIDES_RULE}")
        if " " in name:  # `fasterfs kernel status`
            group, action = name.split(" ", 1)
            if group not in groups:
                groups[group] = sub.add_parser(group, help=f"{group} commands").add_subparsers(
                    dest="_action", required=True, metavar="ACTION", parser_class=Parser)
            p = groups[group].add_parser(action, **kw)
        else:
            p = sub.add_parser(name, **kw)
        for arg, spec in c.args:
            p.add_argument(arg, **spec)
        p.add_argument("--nodes", type=int, metavar="N", help="shorthand for the override nodes=N")
        p.add_argument("--cfg", choices=["job"],
                       help="print the composed configuration (as Hydra's --cfg job) and exit")
        for flag, spec in c.flags:
            p.add_argument(flag, **spec)
        parsers[name] = p
    return parser, parsers


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the words argparse reads, the Hydra overrides), by OVERRIDES_RULE. A command that takes
    no arguments hands every KEY=VALUE word to Hydra, which names a key that does not exist."""
    keys: set[str] | None = config.override_keys()
    plain = [w for w in argv if not w.startswith("-")]
    name = next((n for n in (" ".join(plain[:2]), " ".join(plain[:1])) if n in COMMANDS), None)
    if name is not None and not COMMANDS[name].args:
        keys = None
    words: list[str] = []
    overrides: list[str] = []
    for n, word in enumerate(argv):
        if word == "--":
            return words + argv[n:], overrides
        (overrides if config.is_override(word, keys) else words).append(word)
    return words, overrides


def main(argv: list[str] | None = None) -> int:
    parser, parsers = _parser()
    words, overrides = split_overrides(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(words)
    name = f"{args._command} {args._action}" if getattr(args, "_action", None) else args._command
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    command = COMMANDS[name]
    was_joined = joined()  # main() called by a driver: its connection stays
    try:
        cfg = config.load(([f"nodes={args.nodes}"] if args.nodes else []) + overrides, lab=name.startswith("lab "))
        if args.cfg:
            print(OmegaConf.to_yaml(cfg), end="")
            return 0
        names = [name for name, _ in command.args] + [spec.get("dest", flag.lstrip("-").replace("-", "_"))
                                                       for flag, spec in command.flags]
        command.run(cfg, **{name: getattr(args, name) for name in names})
    except UsageError as e:  # an argument that parsed but names nothing there: as argparse, exit 2
        parsers[name].error(str(e))
    except FasterFSError as e:
        if args.verbose:
            raise
        # one line on stderr, as argparse's own errors: a script or a test greps it whole
        errors = Console(stderr=True, soft_wrap=True, highlight=False)
        cause = getattr(e, "cause", None)  # raised in an actor: its own words, not Ray's remote traceback
        errors.print(f"[red]fasterfs {name}: error:[/] {cause if isinstance(cause, FasterFSError) else e}")
        return 2 if isinstance(e, ConfigError) else 1
    finally:
        if not was_joined:
            leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
