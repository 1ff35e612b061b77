//! A region's recent sale rate: an exponentially weighted moving average
//! of units held per second, fed with `now` by the caller.

/// Units per second, smoothed over roughly `half_life_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateMeter {
    half_life_ms: u64,
    rate_per_s: f64,
    bucket_units: u64,
    bucket_start_ms: u64,
}

/// Width of one averaging step.
const BUCKET_MS: u64 = 100;

impl RateMeter {
    /// A meter at rate 0 starting at `now_ms`.
    pub fn new(now_ms: u64, half_life_ms: u64) -> Self {
        Self {
            half_life_ms: half_life_ms.max(BUCKET_MS),
            rate_per_s: 0.0,
            bucket_units: 0,
            bucket_start_ms: now_ms,
        }
    }

    /// Records `units` sold at `now_ms`.
    pub fn record(&mut self, now_ms: u64, units: u64) {
        self.roll(now_ms);
        self.bucket_units += units;
    }

    /// The smoothed rate at `now_ms`.
    pub fn rate_per_s(&mut self, now_ms: u64) -> f64 {
        self.roll(now_ms);
        self.rate_per_s
    }

    fn roll(&mut self, now_ms: u64) {
        while now_ms >= self.bucket_start_ms + BUCKET_MS {
            let sample = self.bucket_units as f64 * 1000.0 / BUCKET_MS as f64;
            let alpha = 1.0 - 0.5f64.powf(BUCKET_MS as f64 / self.half_life_ms as f64);
            self.rate_per_s += alpha * (sample - self.rate_per_s);
            self.bucket_units = 0;
            self.bucket_start_ms += BUCKET_MS;
            if self.rate_per_s < 1e-6 && now_ms > self.bucket_start_ms + 100 * self.half_life_ms {
                // Long idle: skip ahead instead of stepping through empty buckets.
                self.rate_per_s = 0.0;
                self.bucket_start_ms = now_ms - (now_ms - self.bucket_start_ms) % BUCKET_MS;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a steady rate converges to itself and decays when sales stop.
    #[test]
    fn converges_and_decays() {
        let mut m = RateMeter::new(0, 1_000);
        for t in 0..10_000u64 {
            if t % 10 == 0 {
                m.record(t, 1);
            }
        }
        let r = m.rate_per_s(10_000);
        assert!((r - 100.0).abs() < 10.0, "{r}");
        assert!(m.rate_per_s(20_000) < 1.0);
        assert_eq!(m.rate_per_s(10_000_000), 0.0);
    }
}
