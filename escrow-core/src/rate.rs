//! A region's recent demand: an exponentially weighted moving average of
//! units asked for per second, fed with `now` by the caller.
//!
//! A flash sale is over in well under a second, so the meter must know the
//! rate within tens of milliseconds of the first request. Two things make
//! it do so: it wakes at the first units after an idle spell (the idle time
//! before the sale does not count as a rate of 0), and its average is
//! corrected for starting at 0 (divided by the weight the observed time
//! carries, as Adam's moment estimates are), with the bucket being filled
//! counted by the share of it that has passed.

/// Units per second, smoothed over roughly `half_life_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateMeter {
    half_life_ms: u64,
    /// Moving average of closed buckets' rates, started at 0.
    smoothed: f64,
    /// Weight the closed buckets carry in `smoothed`: 0 while asleep,
    /// towards 1 as the meter runs.
    weight: f64,
    bucket_units: u64,
    bucket_start_ms: u64,
    /// When units were last asked for.
    last_units_ms: u64,
}

/// Width of one averaging step.
const BUCKET_MS: u64 = 100;

/// The bucket being filled counts as at least this long: the first few
/// units of a sale do not make a rate of millions per second.
const ELAPSED_MIN_MS: u64 = 20;

/// Expected gaps between requests without one after which demand counts
/// as stopped ([`RateMeter::demand_per_s`]): at a steady rate, Poisson
/// arrivals leave so long a gap with probability e^-8, about 1 in 3,000.
pub const IDLE_GAPS: f64 = 8.0;

/// Shortest idle spell read as demand that stopped: requests reach an
/// agent in clumps (connection pools, batches of answers), so a busy
/// region may see no request for tens of milliseconds in mid-sale. At 300
/// ms a region whose buyers were all served kept its units a third of a
/// second while others' buyers waited (on loopback `bench tail --shape
/// five-10k` 1.2-1.5x `central`'s last unit; 0.9-1.25x at 100 ms).
pub const IDLE_MIN_MS: f64 = 100.0;

/// Below this a rate counts as none: the meter falls asleep.
const ASLEEP_BELOW_PER_S: f64 = 1e-6;

impl RateMeter {
    /// A meter at rate 0, asleep, at `now_ms`.
    pub fn new(now_ms: u64, half_life_ms: u64) -> Self {
        Self {
            half_life_ms: half_life_ms.max(BUCKET_MS),
            smoothed: 0.0,
            weight: 0.0,
            bucket_units: 0,
            bucket_start_ms: now_ms,
            last_units_ms: now_ms,
        }
    }

    /// Records `units` asked for at `now_ms`.
    pub fn record(&mut self, now_ms: u64, units: u64) {
        if units == 0 {
            return self.roll(now_ms);
        }
        if self.is_asleep() {
            self.bucket_start_ms = now_ms;
        } else {
            self.roll(now_ms);
        }
        self.bucket_units += units;
        self.last_units_ms = self.last_units_ms.max(now_ms);
    }

    /// The rate at `now_ms` as demand to plan for: the smoothed rate, but
    /// once no units were asked for during [`IDLE_GAPS`] of its expected
    /// gaps between requests and at least [`IDLE_MIN_MS`], demand has
    /// stopped and the rate reads as at most one request per idle spell. A
    /// burst's end is then known within tens of milliseconds instead of
    /// after several half-lives, so units left where its buyers were can
    /// move to buyers waiting elsewhere.
    pub fn demand_per_s(&mut self, now_ms: u64) -> f64 {
        let rate = self.rate_per_s(now_ms);
        match self.stops_at(rate) {
            Some(at) if now_ms >= at => {
                let idle_ms = now_ms.saturating_sub(self.last_units_ms) as f64;
                rate.min(1_000.0 / idle_ms)
            }
            _ => rate,
        }
    }

    /// When demand reads as stopped if no units are asked for until then,
    /// at the rate measured at `now_ms`; `None` while there is no rate.
    pub fn stops_at_ms(&mut self, now_ms: u64) -> Option<u64> {
        let rate = self.rate_per_s(now_ms);
        self.stops_at(rate)
    }

    /// [`RateMeter::stops_at_ms`] at the smoothed rate `rate`.
    fn stops_at(&self, rate: f64) -> Option<u64> {
        (rate > 0.0).then(|| {
            let idle_ms = (IDLE_GAPS * 1_000.0 / rate).max(IDLE_MIN_MS);
            self.last_units_ms + idle_ms.ceil() as u64
        })
    }

    /// The smoothed rate at `now_ms`.
    pub fn rate_per_s(&mut self, now_ms: u64) -> f64 {
        self.roll(now_ms);
        if self.is_asleep() {
            return 0.0;
        }
        let elapsed_ms = now_ms.saturating_sub(self.bucket_start_ms);
        let partial_rate =
            self.bucket_units as f64 * 1_000.0 / elapsed_ms.max(ELAPSED_MIN_MS) as f64;
        let alpha = self.alpha(elapsed_ms);
        let weight = self.weight + alpha * (1.0 - self.weight);
        if weight <= 0.0 {
            return partial_rate;
        }
        (self.smoothed + alpha * (partial_rate - self.smoothed)) / weight
    }

    fn is_asleep(&self) -> bool {
        self.weight == 0.0 && self.bucket_units == 0
    }

    /// The moving average's step for `ms` of time.
    fn alpha(&self, ms: u64) -> f64 {
        1.0 - 0.5f64.powf(ms as f64 / self.half_life_ms as f64)
    }

    fn roll(&mut self, now_ms: u64) {
        if self.is_asleep() {
            self.bucket_start_ms = self.bucket_start_ms.max(now_ms);
            return;
        }
        let alpha = self.alpha(BUCKET_MS);
        while now_ms >= self.bucket_start_ms + BUCKET_MS {
            let sample = self.bucket_units as f64 * 1_000.0 / BUCKET_MS as f64;
            self.smoothed += alpha * (sample - self.smoothed);
            self.weight += alpha * (1.0 - self.weight);
            self.bucket_units = 0;
            self.bucket_start_ms += BUCKET_MS;
            if self.smoothed / self.weight < ASLEEP_BELOW_PER_S {
                // Idle long enough: asleep until the next units.
                self.smoothed = 0.0;
                self.weight = 0.0;
                self.bucket_start_ms = now_ms;
                return;
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

    /// Goal: a sale that starts after a long idle spell is measured within
    /// a few tens of milliseconds, not after several half-lives.
    #[test]
    fn knows_a_sudden_rate_within_tens_of_ms() {
        let mut m = RateMeter::new(0, 2_000);
        assert_eq!(m.rate_per_s(60_000), 0.0);
        // 4,000 units per second from 60 s: 4 units every ms.
        for t in 60_000..60_030u64 {
            m.record(t, 4);
        }
        let r = m.rate_per_s(60_030);
        assert!((r - 4_000.0).abs() < 400.0, "{r}");
        for t in 60_030..60_250u64 {
            m.record(t, 4);
        }
        let r = m.rate_per_s(60_250);
        assert!((r - 4_000.0).abs() < 400.0, "{r}");
    }

    /// Goal: once requests stop for many expected gaps, the demand reads
    /// as stopped at once while the smoothed rate still decays; a steady
    /// rate never reads as stopped.
    #[test]
    fn demand_stops_when_requests_stop() {
        let mut m = RateMeter::new(0, 2_000);
        for t in 0..1_000u64 {
            m.record(t, 1);
            assert!(m.demand_per_s(t) > 0.0);
        }
        let steady = m.demand_per_s(1_000);
        assert!((steady - 1_000.0).abs() < 100.0, "{steady}");
        // 1,000/s: 8 gaps are 8 ms, but a spell under 100 ms is a clump.
        assert!(m.demand_per_s(1_090) > 500.0);
        // 400 ms later, at most 2.5 per second; the smoothed rate is high.
        assert!(m.demand_per_s(1_400) <= 2.5);
        assert!(m.rate_per_s(1_400) > 300.0);
    }

    /// Goal: a rate that stops decays with the half-life, then the meter
    /// sleeps and wakes at the next sale's rate.
    #[test]
    fn halves_in_a_half_life_and_wakes_again() {
        let mut m = RateMeter::new(0, 1_000);
        for t in 0..5_000u64 {
            m.record(t, 1);
        }
        let before = m.rate_per_s(5_000);
        let after = m.rate_per_s(6_000);
        assert!((after / before - 0.5).abs() < 0.05, "{before} -> {after}");
        assert_eq!(m.rate_per_s(600_000), 0.0);
        for t in 600_000..600_040u64 {
            m.record(t, 2);
        }
        let r = m.rate_per_s(600_040);
        assert!((r - 2_000.0).abs() < 200.0, "{r}");
    }
}
