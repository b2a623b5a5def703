//! The FUSE filesystem: metadata from the pushed tree, opens either native
//! passthrough (hot files, their backings in backing.rs), fetched here
//! (fetch.rs) or forwarded to the agent.
//!
//! Here the kernel's requests, each answered from the tree or handed to the
//! daemon's state (shared.rs): names and listings in lookup.rs, opens in
//! open.rs, reads and releases in read.rs.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

use crate::shared::Shared;

pub struct FuseFs(pub Arc<Shared>);

pub fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Passthrough needs the capability plus a stacking depth of >= 1.
        let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        if !ok {
            eprintln!("ffs-mount: kernel lacks FUSE passthrough; all opens go to the agent");
        }
        self.0.passthrough_ok.store(ok, Relaxed);
        self.0.stats.passthrough_enabled.store(ok, Relaxed);
        // Lookups in one directory may run concurrently across our threads.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // Listings carry each entry's attributes when the lister then looks at
        // them (`ls -l`: no LOOKUP per entry, 1,000 round trips for a 1,000-file
        // directory); the kernel's adaptive mode keeps plain names for `find`,
        // whose dentries would cost the kernel ~5 us an entry for nothing.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Read-only: no write is larger than a read, and each ring entry's payload is sized
        // for the largest of either.
        let _ = config.set_max_write(1 << 20);
        let uring = self.0.uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
        self.0.stats.uring.store(uring, Relaxed);
        if self.0.uring && !uring {
            eprintln!("ffs-mount: the kernel offers no FUSE over io_uring (fuse.enable_uring); requests go through /dev/fuse");
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = &self.0;
        s.stats.lookups.fetch_add(1, Relaxed);
        // Paths are JSON strings: a name that is not UTF-8 is in no tree.
        match name
            .to_str()
            .map_or(Err(libc::ENOENT), |n| s.find_held(parent.0, n))
        {
            Ok(a) => reply.entry(&s.ttl, &a, Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    // (BATCH_FORGET comes here too: fuser's default splits it.)
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.0.stats.getattrs.fetch_add(1, Relaxed);
        match self.0.tree().attr(ino.0) {
            Some(a) => reply.attr(&self.0.ttl, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.0.tree().nodes.get(&ino.0) {
            // The kernel keeps the listing it read (a second `find` or `ls` asks
            // nothing); the entry invalidation of a name changed in it (inbound.rs)
            // bumps the directory's i_version, which drops the kept listing.
            Some(n) if n.dir => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.0.readdir(ino, offset, reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.0.readdirplus(ino, offset, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.0.open(ino, flags, reply);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.0.read(fh, offset, size, reply);
    }

    // A read-only mount has nothing to flush: ENOSYS once, and the kernel
    // sends no more FLUSHes (each close() waited on one round trip).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.release(fh, reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self.0.tree().nodes.contains_key(&ino.0) {
            true => reply.ok(),
            false => reply.error(Errno::ENOENT),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // ENOSYS, not ENODATA: the kernel then stops asking (no round trip per
        // file for the ACL and SELinux labels `ls -l` looks up).
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    // ---- everything that would modify the tree: read-only filesystem ----

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }
    fn mknod(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _d: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }
    fn mkdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }
    fn unlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
    fn rmdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
    fn symlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }
    fn rename(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
    fn link(&self, _r: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }
    fn write(
        &self,
        _r: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _d: &[u8],
        _wf: WriteFlags,
        _f: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }
    fn create(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
    fn setxattr(
        &self,
        _r: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
    fn removexattr(&self, _r: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
    fn fallocate(
        &self,
        _r: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _l: u64,
        _m: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
}
