"""A lab host's `ray start`, in a mount namespace of its own: run as
`python -m fasterfs.hosts.private_host ROOT DISK KEEP CMD...` inside `unshare --mount`.

A lab host shares nothing but the network (and the installed software) with the others: its
own mount namespace, in which its disk is its cluster root (whatever this machine has mounted
there is detached first) and /tmp (Ray's session directory) and /dev/shm (the object store's
files) are its own. The disk, and the software when it lies
under /tmp (a checkout there), are opened before the new /tmp hides them and bound back from
their file descriptors. The final exec keeps the PID, so the PID FasterFS records is the
`ray start` process itself.
"""
import os
import subprocess
import sys


def main() -> None:
    root, disk, keep, cmd = sys.argv[1], sys.argv[2], [p for p in sys.argv[3].split(":") if p], sys.argv[4:]
    fds = {p: os.open(p, os.O_PATH) for p in [disk, *keep]}

    def mount(*args: str) -> None:
        subprocess.run(["mount", "--no-canonicalize", *args], check=True, pass_fds=tuple(fds.values()))

    mount("--make-rprivate", "/")
    # what this machine has mounted under the host's root (another cluster's bpffs at the same
    # path, say) is not the host's: detached here, in this namespace only, before its disk goes there
    # (not the mounts the disk and the software lie on: they are bound from them below)
    for point in sorted(_mounted_under(root), key=len, reverse=True):
        if not any(p == point or p.startswith(point + "/") for p in [disk, *keep]):
            subprocess.run(["umount", "--lazy", point], check=True)
    mount("-t", "tmpfs", "-o", "mode=1777", "ffs-tmp", "/tmp")
    mount("-t", "tmpfs", "-o", "mode=1777", "ffs-shm", "/dev/shm")
    for path in [*keep, root]:
        os.makedirs(path, exist_ok=True)
        mount("--bind", f"/proc/self/fd/{fds[disk if path == root else path]}", path)
    os.chdir("/")
    os.execvp(cmd[0], cmd)


def _mounted_under(root: str) -> list[str]:
    """Mount points at or below `root` in this mount namespace (/proc/self/mountinfo's fifth field)."""
    top = root.rstrip("/")
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    return [p for p in points if p == top or p.startswith(top + "/")]


if __name__ == "__main__":
    main()
