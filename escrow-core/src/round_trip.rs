//! A region's round trip to the coordinator, as its syncs report it and
//! the policy plans by it.
//!
//! Each answered sync measures one round trip, and one can be far off: a
//! sync sent while the coordinator was stalled (a process paused, a
//! frozen machine, a slow disk) comes back when it resumes, seconds later.
//! Reported as it came, that one sample made the policy treat a region 30
//! ms away as 1.5 s away until the next sync: it kept that region a cushion
//! for a round trip fifty times too long, and stopped merging the tail by
//! the nearest region's distance (the fault suite's frozen coordinator,
//! 2026-12-07). The estimate is the median of the last
//! [`ROUND_TRIP_SAMPLES`] answered syncs: one stalled sync in a row of them
//! moves nothing, and a lasting change (a new route, a loaded coordinator)
//! is followed within three syncs.
//!
//! The region agent and the simulator's agent both report with
//! [`RoundTrip`], so the policy sees the same figure from either.

use std::collections::VecDeque;

/// Answered syncs the estimate is the median of.
pub const ROUND_TRIP_SAMPLES: usize = 5;

/// The last [`ROUND_TRIP_SAMPLES`] round trips of an agent's syncs.
#[derive(Debug, Clone, Default)]
pub struct RoundTrip {
    samples: VecDeque<u64>,
}

impl RoundTrip {
    /// One more answered sync, `ms` after it was sent.
    pub fn record(&mut self, ms: u64) {
        if self.samples.len() == ROUND_TRIP_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(ms);
    }

    /// The round trip to report, ms: the median of the recorded ones (the
    /// lower of the middle two of an even count), 0 before any.
    pub fn estimate_ms(&self) -> u64 {
        let mut sorted: Vec<u64> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        sorted
            .get(sorted.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(samples: &[u64]) -> u64 {
        let mut rtt = RoundTrip::default();
        for &ms in samples {
            rtt.record(ms);
        }
        rtt.estimate_ms()
    }

    /// Goal: nothing measured reports 0; one sample reports itself.
    #[test]
    fn the_first_sample_is_the_estimate() {
        assert_eq!(after(&[]), 0);
        assert_eq!(after(&[31]), 31);
    }

    /// Goal: a sync answered after a stall does not move the estimate,
    /// whether it is the newest sample or the second.
    #[test]
    fn one_stalled_sync_moves_nothing() {
        assert_eq!(after(&[30, 1_492]), 30);
        assert_eq!(after(&[30, 32, 29, 31, 1_492]), 31);
        assert_eq!(after(&[30, 32, 29, 1_492, 31]), 31);
    }

    /// Goal: a lasting change is followed within three syncs, and the
    /// oldest samples are forgotten.
    #[test]
    fn a_lasting_change_is_followed() {
        assert_eq!(after(&[30, 30, 30, 30, 30, 230, 230]), 30);
        assert_eq!(after(&[30, 30, 30, 30, 30, 230, 230, 230]), 230);
        assert_eq!(after(&[230, 230, 230, 230, 230, 30, 30, 30]), 30);
    }
}
