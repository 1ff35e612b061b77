//! A small deterministic generator (xorshift) for tests whose inputs are
//! drawn from a seed: the same seed draws the same stream on every run.

/// A stream of numbers drawn from a seed.
#[derive(Debug, Clone)]
pub struct Draw(u64);

impl Draw {
    /// The stream of `seed` (0 is replaced: xorshift never leaves it).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next number, below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A soak's seed: `ESCROW_SOAK_SEED` if set, else one from the clock (odd,
/// never 0). The soak prints it, so a failure can be replayed.
pub fn soak_seed() -> u64 {
    std::env::var("ESCROW_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |t| t.as_nanos() as u64)
                | 1
        })
}

/// A failover soak's plan: its seed ([`soak_seed`]), how many failovers
/// (`ESCROW_SOAK_FAILOVERS`, default 10) and the stream drawn from the
/// seed; both printed, so a failure can be replayed.
pub fn failover_soak() -> (u64, usize, Draw) {
    let seed = soak_seed();
    let failovers = std::env::var("ESCROW_SOAK_FAILOVERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    eprintln!("soak: ESCROW_SOAK_SEED={seed}, {failovers} failovers");
    (seed, failovers, Draw::new(seed))
}
