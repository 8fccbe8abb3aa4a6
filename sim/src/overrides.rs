//! The process's randomness and clocks, as the simulation sees them: this module defines the C
//! functions `getrandom` and `clock_gettime`, which the executable's own definitions make
//! every caller in the process use (std's HashMap keys, tokio, openraft, `Instant::now`,
//! `SystemTime::now`).
//!
//! On the simulation thread, once [`enter`] was called there, randomness comes from the seed
//! and time from the simulation: the monotonic clocks read the running host's tokio clock
//! (paused, moved by turmoil's steps), or the simulation's elapsed time outside a host; the
//! wall clock reads [`WALL_START_MS`] plus the simulation's elapsed time. Everywhere else (the
//! process before the simulation starts, other threads, the batch runner) both are the real
//! ones, by system call: libraries that calibrate against the clock before `main` (foyer's
//! `fastant` spins until the clock moves) keep working.
//!
//! These are the only unsafe lines of Silt: a C function's raw pointers, and the layout of
//! `std::time::Instant` on Linux (a `timespec`), which a compile-time check below holds to.

#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// The simulated wall clock at the simulation's start: 2026-01-01T00:00:00Z, in ms since the
/// Unix epoch. Fixed, so that a seed's timestamps are the same in every run.
pub(crate) const WALL_START_MS: u64 = 1_767_225_600_000;

/// The simulated monotonic clock outside any host: a fixed point, plus the elapsed time.
const MONOTONIC_START: Duration = Duration::from_secs(1_000_000);

thread_local! {
    /// Whether this thread runs the simulation (set once, by [`enter`]).
    static SIMULATING: Cell<bool> = const { Cell::new(false) };
    /// The seeded randomness of the simulation thread.
    static RNG: RefCell<Option<StdRng>> = const { RefCell::new(None) };
    /// Whether this thread is inside [`clock_gettime`] already (a runtime whose clock is not
    /// paused reads the real one through it).
    static READING_CLOCK: Cell<bool> = const { Cell::new(false) };
}

/// Makes the calling thread the simulation thread of seed `seed`: from now on its randomness
/// comes from the seed and its clocks from the simulation. Call it first thing on a thread of
/// its own, before that thread creates a HashMap (std draws a thread's hash keys once).
pub(crate) fn enter(seed: u64) {
    RNG.with(|rng| *rng.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
    SIMULATING.with(|s| s.set(true));
}

fn simulating() -> bool {
    SIMULATING.try_with(Cell::get).unwrap_or(false)
}

/// `getrandom(2)`: the seed's bytes on the simulation thread, the kernel's elsewhere.
#[unsafe(no_mangle)]
#[inline(never)]
unsafe extern "C" fn getrandom(buf: *mut u8, buflen: usize, flags: u32) -> isize {
    if buf.is_null() || buflen == 0 {
        return 0;
    }
    if simulating() {
        // SAFETY: the caller hands a buffer of `buflen` writable bytes, as getrandom(2) asks.
        let dest = unsafe { std::slice::from_raw_parts_mut(buf, buflen) };
        let filled = RNG.try_with(|rng| match rng.try_borrow_mut() {
            Ok(mut rng) => rng.as_mut().map(|rng| rng.fill_bytes(dest)).is_some(),
            Err(_) => false,
        });
        if filled == Ok(true) {
            return buflen as isize;
        }
    }
    // SAFETY: the same arguments, to the system call the libc function wraps.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, buflen, flags) as isize }
}

/// `getentropy(3)`, through [`getrandom`].
#[unsafe(no_mangle)]
#[inline(never)]
unsafe extern "C" fn getentropy(buf: *mut u8, buflen: usize) -> libc::c_int {
    if buflen > 256 {
        return -1;
    }
    // SAFETY: passed on as given.
    match unsafe { getrandom(buf, buflen, 0) } {
        n if n == buflen as isize => 0,
        _ => -1,
    }
}

/// `std::time::Instant` on Linux, whose layout a tokio `Instant` (a std one) is read through.
#[derive(Clone, Copy)]
#[repr(C)]
struct StdTimespec {
    tv_sec: i64,
    tv_nsec: u32,
}

const _: () = assert!(std::mem::size_of::<StdTimespec>() == std::mem::size_of::<std::time::Instant>());

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long }
}

fn elapsed() -> Duration {
    turmoil::sim_elapsed().unwrap_or(Duration::ZERO)
}

/// The simulated clock `clockid`, or `None` for a clock the simulation does not replace.
fn simulated(clockid: libc::clockid_t) -> Option<libc::timespec> {
    match clockid {
        libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE => {
            Some(timespec(Duration::from_millis(WALL_START_MS) + elapsed()))
        }
        libc::CLOCK_MONOTONIC
        | libc::CLOCK_MONOTONIC_RAW
        | libc::CLOCK_MONOTONIC_COARSE
        | libc::CLOCK_BOOTTIME => {
            if tokio::runtime::Handle::try_current().is_ok() {
                let now = tokio::time::Instant::now().into_std();
                // SAFETY: the sizes match (checked above) and std's Instant on Linux is a
                // timespec of seconds and nanoseconds.
                let ts: StdTimespec = unsafe { std::mem::transmute(now) };
                Some(libc::timespec {
                    tv_sec: ts.tv_sec as libc::time_t,
                    tv_nsec: ts.tv_nsec as libc::c_long,
                })
            } else {
                Some(timespec(MONOTONIC_START + elapsed()))
            }
        }
        _ => None,
    }
}

/// `clock_gettime(2)`: the simulation's clocks on the simulation thread, the kernel's
/// elsewhere.
#[unsafe(no_mangle)]
#[inline(never)]
unsafe extern "C" fn clock_gettime(clockid: libc::clockid_t, tp: *mut libc::timespec) -> libc::c_int {
    if simulating() && !tp.is_null() && !READING_CLOCK.with(|r| r.replace(true)) {
        let ts = simulated(clockid);
        READING_CLOCK.with(|r| r.set(false));
        if let Some(ts) = ts {
            // SAFETY: the caller hands a timespec to write, as clock_gettime(2) asks.
            unsafe { tp.write(ts) };
            return 0;
        }
    }
    // SAFETY: the same arguments, to the system call the libc function wraps.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clockid, tp) as libc::c_int }
}
