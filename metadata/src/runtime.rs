//! Where blocking work (file I/O, encoding) leaves the async tasks: [`spawn_blocking`], the one
//! call every Silt crate makes instead of `tokio::task::spawn_blocking`.
//!
//! On a thread pool the order in which blocking work finishes, relative to the tasks, is the
//! operating system's choice. The deterministic simulator (`silt-sim`) calls
//! [`run_blocking_inline`] once, before anything starts: from then on blocking work runs at
//! once, on the calling task's thread, so that a seed decides every interleaving.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::task::JoinHandle;

static INLINE: AtomicBool = AtomicBool::new(false);

/// Runs `f` where blocking work may run: on tokio's blocking pool, or at once on this thread
/// in a simulation (see the module documentation). Either way the answer comes from the
/// returned handle.
pub fn spawn_blocking<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if INLINE.load(Ordering::Relaxed) {
        let done = f();
        tokio::spawn(async move { done })
    } else {
        tokio::task::spawn_blocking(f)
    }
}

/// From now on, runs blocking work on the calling thread, for the process's lifetime. For the
/// simulator only: a server doing so stalls every task behind each disk access.
pub fn run_blocking_inline() {
    INLINE.store(true, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocking_work_answers_through_its_handle() {
        let answer = spawn_blocking(|| 6 * 7).await.expect("the blocking work ran");
        assert_eq!(answer, 42);
    }
}
