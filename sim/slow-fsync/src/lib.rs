//! `libsilt_slow_fsync.so`, which `silt-faults` preloads (`LD_PRELOAD`) into every agent so that
//! a fault can make its disk slow: `fsync` and `fdatasync` (what Rust's `File::sync_all` and
//! `sync_data` call) first wait the number of milliseconds written in the file
//! `$SILT_SLOW_FSYNC_FILE` names, read again at every call (no file, or 0: no wait; at most a
//! minute), then call the C library's.
#![allow(unsafe_code, reason = "it defines C functions and calls the ones it stands in front of")]

use std::ffi::{c_int, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

type SyncFn = unsafe extern "C" fn(c_int) -> c_int;

/// The next definition of `name` after this library's: the C library's.
fn next(name: &CStr) -> Option<SyncFn> {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT asks for the definition after this object's.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    // SAFETY: the symbols looked up are fsync and fdatasync, both `int (int)`.
    (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, SyncFn>(f) })
}

/// Waits as long as the control file says.
fn delay() {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let Some(file) = FILE.get_or_init(|| std::env::var_os("SILT_SLOW_FSYNC_FILE").map(PathBuf::from)) else {
        return;
    };
    let ms = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
}

/// Calls `real` (found once) on `fd`, or fails with ENOSYS when there is none.
///
/// # Safety
/// `real` holds a function of the C library taking a file descriptor.
unsafe fn call(real: &OnceLock<Option<SyncFn>>, name: &CStr, fd: c_int) -> c_int {
    match real.get_or_init(|| next(name)) {
        // SAFETY: the C library's function, given what the caller was given.
        Some(f) => unsafe { f(fd) },
        None => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
}

/// `fsync(2)`, after the wait the control file says.
///
/// # Safety
/// As `fsync(2)`: `fd` is any integer; the kernel checks it.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    static REAL: OnceLock<Option<SyncFn>> = OnceLock::new();
    delay();
    // SAFETY: REAL holds the C library's fsync.
    unsafe { call(&REAL, c"fsync", fd) }
}

/// `fdatasync(2)`, after the wait the control file says.
///
/// # Safety
/// As `fdatasync(2)`.
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    static REAL: OnceLock<Option<SyncFn>> = OnceLock::new();
    delay();
    // SAFETY: REAL holds the C library's fdatasync.
    unsafe { call(&REAL, c"fdatasync", fd) }
}
