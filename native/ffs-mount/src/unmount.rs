//! Unmounting at exit, only if the mount at the mountpoint is still ours.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Device ("major:minor") of the topmost mount at `mp`, from mountinfo.
/// Reading mountinfo never calls into our own filesystem.
pub fn mount_dev(mp: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mp.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones: search from the end.
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && unescape(f[4]) == want).then(|| f[2].to_string())
    })
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Unmount only if the topmost mount at `mp` is still ours (the agent may
/// already have detached it and mounted a successor at the same path).
pub fn unmount_if_ours(mp: &Path, dev: &Option<String>) {
    if dev.is_none() || mount_dev(mp) != *dev {
        return;
    }
    let c = CString::new(mp.as_os_str().as_bytes()).unwrap();
    // Plain umount first; if files are still open, detach lazily. Our exit
    // then closes /dev/fuse, which aborts the connection for those files.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
