//! Where the agent's `now` comes from.
//!
//! escrow-core never reads a clock; the agent passes it `now_ms` from a
//! [`Clock`]. Production uses [`SystemClock`]; tests use [`ManualClock`] to
//! move time past a hold's expiry without sleeping.
//!
//! One `now` serves both as the stored deadline of a hold (`expires_at`)
//! and as the timer that sweeps it, so it must not jump: a wall clock
//! stepped an hour forward would expire every hold at once, one stepped
//! back would keep every hold (and stop the sweeps and takes timed from
//! it) for an hour. [`SystemClock`] therefore reads the wall clock once per
//! process and moves with the monotonic clock from there: a hold lives its
//! TTL whatever the wall clock does meanwhile, and a restart adopts the
//! wall clock as it then is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in ms since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now_ms(&self) -> u64;
}

/// The wall clock as this process first read it, advanced by the monotonic
/// clock since: steps of the wall clock while the process runs do not move
/// it (see [`SystemClock::step_ms`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl SystemClock {
    /// The wall clock's reading minus this clock's, in ms: how far the wall
    /// clock has been stepped (or has drifted) since the process started.
    pub fn step_ms(&self) -> i64 {
        let signed = |ms: u64| i64::try_from(ms).expect("milliseconds since 1970 fit in i64");
        signed(wall_ms()) - signed(self.now_ms())
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        static ANCHOR: OnceLock<(u64, Instant)> = OnceLock::new();
        let (wall_at_start_ms, start) = ANCHOR.get_or_init(|| (wall_ms(), Instant::now()));
        let since_start_ms = u64::try_from(start.elapsed().as_millis())
            .expect("milliseconds since the process started fit in u64");
        wall_at_start_ms + since_start_ms
    }
}

/// The system's wall clock, ms since the epoch.
fn wall_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the system clock is after 1970");
    u64::try_from(since_epoch.as_millis()).expect("milliseconds since 1970 fit in u64")
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(AtomicU64::new(start_ms))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
