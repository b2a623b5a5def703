#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (run as root):
#   Debian packages (BCC, kernel headers), the kernel build link BCC needs,
#   MinIO built at a pinned version, a virtualenv with FasterFS installed, JupyterLab,
#   and the native FUSE daemon (cargo).
#   `setup.sh test` adds what only the tests and benchmarks use: a headless browser, the peer
#   mounts and fio, bpftool, the [dev] extras (pytest, ruff, mypy), the daemon's own tests built.
# Every step checks whether its result is already there and skips itself if so.
set -euo pipefail
MODE=${1:-run}
case "$MODE" in run|test) ;; *) echo "setup: unknown mode '$MODE' (run or test)" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
ROOT=$PWD

MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"   # pinned; see README
PIP_VERSION="26.3"                                    # pinned: the same set-up on every machine
JUPYTERLAB_VERSION="4.6.6"                            # pinned; `fasterfs notebook`
DEPS="$ROOT/.deps"
VENV="$ROOT/.venv"
# fuse3: the mount; redis-server: cluster.namespace_store=redis
APT_PACKAGES=(bpfcc-tools python3-bpfcc linux-headers-amd64 libbpf1 iproute2 python3-venv fuse3 redis-server)
# tests and benchmarks only: chromium, the headless browser the dashboard's page test drives; fio, the
# mount's benchmark; s3fs, rclone, the peer mounts it measures against; bpftool, the kernel's own view;
# openssh-server and rsync, what Ray's cluster launcher needs of the lab machines `ray up` is tested on
[ "$MODE" = test ] && APT_PACKAGES+=(chromium fio s3fs rclone bpftool openssh-server rsync)

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# 1. Debian packages -----------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
ssh_new=0  # openssh-server installed by this run (not a server the machine had before)
case " ${missing[*]} " in *" openssh-server "*) ssh_new=1 ;; esac
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # No service a package brings is started by its install (policy-rc.d: 101, "not allowed"):
  # Debian's redis-server would take port 6379 (Ray's head port on real machines,
  # cluster.yaml); FasterFS starts its own Redis on a unix socket when it is asked for one.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  [ -n "$policy" ] && rm -f "$policy" && trap - EXIT
else
  say "Debian packages present"
fi
# ... nor at boot, where systemd runs: the system's Redis service stays off (FasterFS never uses it),
# and so does the SSH server the tests' lab machines each start for themselves.
if [ -d /run/systemd/system ] && systemctl is-enabled --quiet redis-server 2>/dev/null; then
  say "Debian's redis-server service disabled and stopped (it listens on 6379, Ray's head port in cluster.yaml)"
  systemctl disable --now --quiet redis-server
fi
if [ "$ssh_new" = 1 ] && [ -d /run/systemd/system ] && systemctl is-enabled --quiet ssh 2>/dev/null; then
  say "Debian's ssh service (installed for the tests' lab machines) disabled and stopped"
  systemctl disable --now --quiet ssh ssh.socket 2>/dev/null || true
fi

# 2. Kernel build directory for BCC -------------------------------------------
# BCC compiles the programs against the running kernel's headers: Debian's package of them when
# it has one; else (a kernel Debian did not build) the newest Debian headers, which serve the
# networking programs FasterFS compiles (their structs are read through BPF helpers, not offsets).
KBUILD="/lib/modules/$(uname -r)/build"
if [ ! -e "$KBUILD/include" ] && apt-cache show "linux-headers-$(uname -r)" >/dev/null 2>&1; then
  say "installing linux-headers-$(uname -r), the running kernel's own"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "linux-headers-$(uname -r)" >/dev/null
fi
if [ ! -e "$KBUILD/include" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n1)
  if [ -n "$hdr" ] && [ -n "$common" ]; then
    say "the running kernel $(uname -r) has no headers package: linking $KBUILD -> $hdr (Debian's newest)"
    mkdir -p "/lib/modules/$(uname -r)"
    ln -sfn "$hdr" "$KBUILD"
    ln -sfn "$common" "/lib/modules/$(uname -r)/source"
  else
    say "WARNING: no kernel headers under /usr/src; eBPF will run in simulated mode"
  fi
else
  say "kernel build directory present: $(readlink -f "$KBUILD")"
fi

# 3. MinIO at a pinned version --------------------------------------------------
if [ -x "$DEPS/bin/minio" ] && [ "$(cat "$DEPS/minio.version" 2>/dev/null)" = "$MINIO_VERSION" ]; then
  say "MinIO $MINIO_VERSION present"
else
  GO=$(command -v go || true)
  [ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
  if [ -z "$GO" ]; then
    echo "setup: Go (>= 1.24) is needed to build MinIO; install it from go.dev or your distribution" >&2
    exit 1
  fi
  say "building MinIO $MINIO_VERSION with $($GO version | cut -d' ' -f3) (about 3 minutes)"
  mkdir -p "$DEPS/bin"
  GOBIN="$DEPS/bin.tmp" GOFLAGS=-mod=mod "$GO" install "github.com/minio/minio@$MINIO_VERSION"
  mv "$DEPS/bin.tmp/minio" "$DEPS/bin/minio" && rmdir "$DEPS/bin.tmp"
  echo "$MINIO_VERSION" > "$DEPS/minio.version"
fi

# 4. Virtualenv with FasterFS and the Debian bcc module ------------------------
PY=/usr/bin/python3
EXTRAS=""
[ "$MODE" = test ] && EXTRAS="[dev]"
stamp="$VENV/.fasterfs-installed-$MODE"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  say "virtualenv up to date"
else
  say "installing FasterFS$EXTRAS into $VENV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "pip==$PIP_VERSION"
  "$VENV/bin/pip" install -q -e ".$EXTRAS"
  # an environment made when JupyterLab lived in it: drop what slowed every `import ray` (step 5)
  "$VENV/bin/pip" uninstall -y -q jupyterlab rfc3987-syntax 2>/dev/null || true
  touch "$stamp"
fi
# Only the bcc package is made visible: the rest of Debian's dist-packages would
# shadow the pinned dependencies. (The PyPI package named "bcc" is unrelated.)
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$site/bcc" ]; then
  ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
fi
# 5. JupyterLab in an environment of its own ------------------------------------
# Its dependencies include rfc3987-syntax (via jsonschema[format-nongpl]), which compiles 38
# grammars when jsonschema is imported: in the project's environment that is 1.4 s of CPU
# added to every `import ray`, so to every Ray worker and agent started. The server runs here;
# its kernels run in the project's environment (fasterfs.dashboard.notebook writes their kernel spec).
LAB="$DEPS/jupyterlab"
if [ -x "$LAB/bin/jupyter-lab" ] && [ "$(cat "$LAB/.version" 2>/dev/null)" = "$JUPYTERLAB_VERSION" ]; then
  say "JupyterLab $JUPYTERLAB_VERSION present"
else
  say "installing JupyterLab $JUPYTERLAB_VERSION into $LAB"
  [ -x "$LAB/bin/python" ] || "$PY" -m venv "$LAB"
  "$LAB/bin/pip" install -q "pip==$PIP_VERSION"
  "$LAB/bin/pip" install -q "jupyterlab==$JUPYTERLAB_VERSION"
  echo "$JUPYTERLAB_VERSION" > "$LAB/.version"
fi
# 6. The native FUSE daemon (native/ffs-mount: Rust on the fuser crate, no libfuse) ---------
# Rebuilt when its sources are newer than the binary; crates pinned by Cargo.lock. fuser 0.18
# has no FUSE-over-io_uring transport (its issue #380): the crate, checked by its crates.io
# digest, gets native/ffs-mount/fuser-uring.patch (a queue per CPU) under native/ffs-mount/vendor.
NATIVE="$ROOT/native/ffs-mount"
FFS_MOUNT="$NATIVE/target/release/ffs-mount"
FUSER="$NATIVE/vendor/fuser-0.18.0"
FUSER_SHA256=b82b6597d216503555ead6b358f341ef748869bf5c6fbae6a0cb9dd231baecfd
if [ ! -f "$FUSER/.patched" ] || [ "$NATIVE/fuser-uring.patch" -nt "$FUSER/.patched" ]; then
  say "fuser 0.18.0 from crates.io, with native/ffs-mount/fuser-uring.patch"
  rm -rf "$FUSER" "$FUSER.crate" && mkdir -p "$NATIVE/vendor"
  "$PY" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    https://static.crates.io/crates/fuser/fuser-0.18.0.crate "$FUSER.crate"
  echo "$FUSER_SHA256  $FUSER.crate" | sha256sum -c --quiet - \
    || { echo "setup: fuser-0.18.0.crate does not have the digest crates.io lists" >&2; exit 1; }
  tar -xzf "$FUSER.crate" -C "$NATIVE/vendor" && rm "$FUSER.crate"
  git -C "$FUSER" init -q && git -C "$FUSER" apply "$NATIVE/fuser-uring.patch"
  touch "$FUSER/.patched"
fi
if [ -x "$FFS_MOUNT" ] && [ -z "$(find "$NATIVE/src" "$NATIVE/Cargo.toml" "$NATIVE/Cargo.lock" "$FUSER/.patched" -newer "$FFS_MOUNT")" ]; then
  say "FUSE daemon native/ffs-mount up to date"
else
  CARGO=$(command -v cargo || true)
  [ -z "$CARGO" ] && [ -x "$HOME/.cargo/bin/cargo" ] && CARGO="$HOME/.cargo/bin/cargo"
  if [ -z "$CARGO" ]; then
    echo "setup: cargo (Rust >= 1.80) is needed to build the FUSE daemon native/ffs-mount; install it with rustup" >&2
    exit 1
  fi
  say "building the FUSE daemon native/ffs-mount with $("$CARGO" --version)"
  "$CARGO" build --release --locked --quiet --manifest-path "$NATIVE/Cargo.toml"
fi
if [ "$MODE" = test ]; then  # the daemon's own tests, built here so the suite only runs them
  CARGO=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
  "$CARGO" test --release --locked --quiet --no-run --manifest-path "$NATIVE/Cargo.toml" 2>/dev/null \
    || "$CARGO" test --release --locked --no-run --manifest-path "$NATIVE/Cargo.toml"
fi
say "done: activate with 'source .venv/bin/activate' or use .venv/bin/fasterfs"
