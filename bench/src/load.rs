//! The load generator: producers at a fixed rate or as fast as they go, consumers reading
//! along, produce-ack and end-to-end latency in HDR histograms.
//!
//! Latency is measured from the time a message was *meant* to be sent, so a system that falls
//! behind a fixed rate shows it in its latency (no coordinated omission). Each message carries
//! that time in its first 16 bytes (hex nanoseconds since the run's clock base), which is how a
//! consumer computes end-to-end latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use tokio::sync::watch;

use crate::latency::Latency;

/// Bytes at the start of every message that hold its intended send time.
pub const STAMP_BYTES: usize = 16;

fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn stamp(at: Instant) -> u64 {
    at.saturating_duration_since(clock_base()).as_nanos() as u64
}

/// The intended send time written at the start of a payload, if it has one.
pub fn read_stamp(payload: &[u8]) -> Option<Instant> {
    let hex = std::str::from_utf8(payload.get(..STAMP_BYTES)?).ok()?;
    let nanos = u64::from_str_radix(hex, 16).ok()?;
    Some(clock_base() + Duration::from_nanos(nanos))
}

/// Where producers send: one request of several messages to one partition, answered once all
/// of them are durable.
#[async_trait::async_trait]
pub trait ProduceTarget: Send + Sync + 'static {
    /// Sends `payloads` to `partition` and waits until every one is acknowledged.
    async fn send(&self, partition: u32, payloads: Vec<Bytes>) -> anyhow::Result<()>;
}

/// What the consumers observed, shared between them.
#[derive(Debug, Default)]
pub struct ConsumeStats {
    /// Messages received (duplicates included).
    pub received: AtomicU64,
    /// Messages received while the window was open: the rate consumers kept up with.
    pub received_in_window: AtomicU64,
    /// End-to-end latency of messages meant to be sent inside the measured window.
    pub end_to_end: Mutex<Latency>,
    /// Errors the consumers met (and went on after).
    pub errors: AtomicU64,
}

/// The measured window, which consumers need to know what to record.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Start of measuring (after the warm-up).
    pub start: Instant,
    /// End of producing.
    pub end: Instant,
}

impl Window {
    /// Whether a message meant to be sent at `t` counts.
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
}

impl ConsumeStats {
    /// Records a batch of received payloads.
    pub fn record(&self, window: &Window, payloads: impl Iterator<Item = Option<Instant>>) {
        let now = Instant::now();
        let mut local = Latency::new();
        let mut n = 0;
        for intended in payloads {
            n += 1;
            if let Some(t) = intended.filter(|t| window.contains(*t)) {
                local.record(now.saturating_duration_since(t));
            }
        }
        self.received.fetch_add(n, Ordering::Relaxed);
        if now >= window.start && now < window.end {
            self.received_in_window.fetch_add(n, Ordering::Relaxed);
        }
        if local.count() > 0 {
            if let Ok(mut h) = self.end_to_end.lock() {
                h.add(&local);
            }
        }
    }
}

/// How producers run.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// Partitions of the topic.
    pub partitions: u32,
    /// Bytes per message value.
    pub message_bytes: usize,
    /// Producer tasks.
    pub producers: u32,
    /// Messages per request at most.
    pub batch_messages: u32,
    /// Requests in flight per producer.
    pub max_inflight: u32,
    /// Longest a message waits for its batch to fill at a fixed rate.
    pub linger: Duration,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Messages per second over all producers; `None` is as fast as possible.
    pub rate_msgs_per_s: Option<f64>,
}

/// What the producers measured.
#[derive(Debug, Default)]
pub struct ProduceOutcome {
    /// Messages acknowledged, warm-up included.
    pub acked_total: u64,
    /// Messages acknowledged inside the window.
    pub acked_in_window: u64,
    /// Messages acknowledged in each second of the window.
    pub per_second_msgs: Vec<u64>,
    /// Produce-ack latency of messages meant to be sent inside the window.
    pub produce_ack: Latency,
    /// Requests that failed.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
}

struct ProducerState {
    acked_total: u64,
    acked_in_window: u64,
    per_second: Vec<u64>,
    latency: Latency,
    errors: u64,
    first_error: Option<String>,
}

/// `len` bytes of random text (the 64 characters of base64), different on every call: message
/// values that compress like real text rather than to nothing. A xorshift generator, so that
/// making a GiB of them costs little client CPU.
pub fn random_text(len: usize, state: &mut u64) -> Bytes {
    const CHARS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let mut x = *state;
        for _ in 0..10 {
            if out.len() == len {
                break;
            }
            out.push(CHARS[(x & 63) as usize]);
            x >>= 6;
        }
    }
    Bytes::from(out)
}

/// Random printable filler for message values (alphanumeric, as readable text in JSON).
pub fn filler(len: usize) -> Bytes {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    Bytes::from((0..len).map(|_| CHARS[rng.random_range(0..CHARS.len())]).collect::<Vec<u8>>())
}

fn payload(filler: &Bytes, intended: Instant) -> Bytes {
    let mut b = BytesMut::from(&filler[..]);
    let hex = format!("{:016x}", stamp(intended));
    b[..STAMP_BYTES].copy_from_slice(hex.as_bytes());
    b.freeze()
}

/// Runs the producers of `plan` against `target`; `window` is when measuring starts and ends
/// (warm-up before it). Returns once every request has been answered.
pub async fn produce(target: Arc<dyn ProduceTarget>, plan: &LoadPlan, t0: Instant) -> ProduceOutcome {
    let _ = clock_base();
    let window = Window { start: t0 + plan.warmup, end: t0 + plan.warmup + plan.duration };
    let filler = filler(plan.message_bytes);
    let mut tasks = Vec::new();
    for p in 0..plan.producers {
        let target = Arc::clone(&target);
        let plan = plan.clone();
        let filler = filler.clone();
        tasks.push(tokio::spawn(async move { producer_task(p, target, plan, t0, window, filler).await }));
    }
    let mut out = ProduceOutcome {
        per_second_msgs: vec![0; plan.duration.as_secs_f64().ceil() as usize],
        ..ProduceOutcome::default()
    };
    for t in tasks {
        match t.await {
            Ok(s) => {
                out.acked_total += s.acked_total;
                out.acked_in_window += s.acked_in_window;
                for (o, v) in out.per_second_msgs.iter_mut().zip(&s.per_second) {
                    *o += v;
                }
                out.produce_ack.add(&s.latency);
                out.errors += s.errors;
                if out.first_error.is_none() {
                    out.first_error = s.first_error;
                }
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert(format!("producer task failed: {e}"));
            }
        }
    }
    // A last partial second would read low; keep whole seconds only.
    if plan.duration.as_secs_f64().fract() > 0.0 {
        out.per_second_msgs.pop();
    }
    out
}

async fn producer_task(
    p: u32,
    target: Arc<dyn ProduceTarget>,
    plan: LoadPlan,
    t0: Instant,
    window: Window,
    filler: Bytes,
) -> ProducerState {
    let mut partitions: Vec<u32> = (p..plan.partitions).step_by(plan.producers as usize).collect();
    if partitions.is_empty() {
        partitions.push(p % plan.partitions);
    }
    let rate = plan.rate_msgs_per_s.map(|r| r / f64::from(plan.producers));
    // Spread the producers' schedules so they do not all send at the same instant.
    let offset = rate
        .map_or(Duration::ZERO, |r| Duration::from_secs_f64(f64::from(p) / r / f64::from(plan.producers)));
    let at = |k: u64| -> Instant {
        match rate {
            Some(r) => t0 + offset + Duration::from_secs_f64(k as f64 / r),
            None => t0,
        }
    };
    let mut st = ProducerState {
        acked_total: 0,
        acked_in_window: 0,
        per_second: vec![0; plan.duration.as_secs_f64().ceil() as usize],
        latency: Latency::new(),
        errors: 0,
        first_error: None,
    };
    let mut inflight = FuturesUnordered::new();
    let mut k: u64 = 0;
    let mut turn = 0usize;
    loop {
        // Which messages go in the next request, and when it leaves.
        let (n, send_at) = match rate {
            Some(_) => {
                let first = at(k);
                if first >= window.end {
                    break;
                }
                let mut n = 1u64;
                while n < u64::from(plan.batch_messages) {
                    let t = at(k + n);
                    if t > first + plan.linger || t >= window.end {
                        break;
                    }
                    n += 1;
                }
                let send_at =
                    if n == u64::from(plan.batch_messages) { at(k + n - 1) } else { first + plan.linger };
                (n, send_at.min(window.end))
            }
            None => {
                if Instant::now() >= window.end {
                    break;
                }
                (u64::from(plan.batch_messages), Instant::now())
            }
        };
        // Wait for a free slot and the send time, handling answers meanwhile.
        loop {
            let full = inflight.len() >= plan.max_inflight as usize;
            if !full && Instant::now() >= send_at {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(send_at.into()), if !full => {}
                Some(done) = inflight.next(), if !inflight.is_empty() => handle(&mut st, done, &window),
            }
        }
        let sent_at = Instant::now();
        // Like a real client's accumulator, messages that came due while the request waited
        // for a free slot join it, up to the batch size.
        let mut n = n;
        if rate.is_some() {
            while n < u64::from(plan.batch_messages) && at(k + n) <= sent_at && at(k + n) < window.end {
                n += 1;
            }
        }
        let intended: Vec<Instant> = match rate {
            Some(_) => (k..k + n).map(at).collect(),
            None => vec![sent_at; n as usize],
        };
        let payloads: Vec<Bytes> = intended.iter().map(|t| payload(&filler, *t)).collect();
        let partition = partitions[turn % partitions.len()];
        turn += 1;
        let target = Arc::clone(&target);
        inflight.push(async move {
            let r = target.send(partition, payloads).await;
            (r, intended, Instant::now())
        });
        k += n;
    }
    while let Some(done) = inflight.next().await {
        handle(&mut st, done, &window);
    }
    st
}

fn handle(st: &mut ProducerState, done: (anyhow::Result<()>, Vec<Instant>, Instant), window: &Window) {
    let (r, intended, acked_at) = done;
    match r {
        Ok(()) => {
            let n = intended.len() as u64;
            st.acked_total += n;
            if acked_at >= window.start && acked_at < window.end {
                st.acked_in_window += n;
                let sec = acked_at.duration_since(window.start).as_secs() as usize;
                if let Some(s) = st.per_second.get_mut(sec) {
                    *s += n;
                }
            }
            for t in intended.iter().filter(|t| window.contains(**t)) {
                st.latency.record(acked_at.saturating_duration_since(*t));
            }
        }
        Err(e) => {
            st.errors += 1;
            st.first_error.get_or_insert_with(|| format!("{e:#}"));
        }
    }
}

/// Starts consumers with `start`, runs the producers, then waits until the consumers have
/// received every acknowledged message or `drain` has passed, and stops them.
pub async fn run<F, Fut>(
    target: Arc<dyn ProduceTarget>,
    plan: &LoadPlan,
    drain: Duration,
    start_consumers: F,
) -> anyhow::Result<(ProduceOutcome, Arc<ConsumeStats>, Window)>
where
    F: FnOnce(Window, Arc<ConsumeStats>, watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<tokio::task::JoinHandle<()>>>>,
{
    let t0 = Instant::now() + Duration::from_millis(200);
    let window = Window { start: t0 + plan.warmup, end: t0 + plan.warmup + plan.duration };
    let stats = Arc::new(ConsumeStats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let consumers =
        start_consumers(window, Arc::clone(&stats), stop_rx).await.context("cannot start consumers")?;
    let outcome = produce(target, plan, t0).await;
    let deadline = Instant::now() + drain;
    while stats.received.load(Ordering::Relaxed) < outcome.acked_total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    for c in consumers {
        let _ = c.await;
    }
    Ok((outcome, stats, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sink(AtomicU64);

    #[async_trait::async_trait]
    impl ProduceTarget for Sink {
        async fn send(&self, _partition: u32, payloads: Vec<Bytes>) -> anyhow::Result<()> {
            assert!(payloads.iter().all(|p| read_stamp(p).is_some()));
            self.0.fetch_add(payloads.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn stamps_read_back() {
        let t = clock_base() + Duration::from_micros(1234);
        let p = payload(&filler(32), t);
        assert_eq!(p.len(), 32);
        assert_eq!(read_stamp(&p), Some(t));
        assert_eq!(read_stamp(b"short"), None);
    }

    #[test]
    fn random_text_differs_and_stays_printable() {
        let mut state = 7;
        let a = random_text(1000, &mut state);
        let b = random_text(1000, &mut state);
        assert_eq!(a.len(), 1000);
        assert_ne!(a, b);
        assert!(a.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/'));
    }

    #[tokio::test]
    async fn a_fixed_rate_sends_that_many_messages() {
        let sink = Arc::new(Sink(AtomicU64::new(0)));
        let plan = LoadPlan {
            partitions: 4,
            message_bytes: 64,
            producers: 2,
            batch_messages: 10,
            max_inflight: 2,
            linger: Duration::from_millis(5),
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(500),
            rate_msgs_per_s: Some(2000.0),
        };
        let out = produce(sink.clone(), &plan, Instant::now()).await;
        // 0.6 s at 2000/s is 1200 messages; the window holds 1000 of them.
        let sent = sink.0.load(Ordering::Relaxed);
        assert!((1150..=1250).contains(&sent), "{sent}");
        assert_eq!(out.acked_total, sent);
        assert!((900..=1100).contains(&out.produce_ack.count()), "{}", out.produce_ack.count());
        assert_eq!(out.errors, 0);
    }
}
