//! The demand a region reports to the coordinator: the owner's meter of
//! units asked for, held back until a spell of demand is old enough to say
//! something about its rate.

use super::{SkuOwner, RATE_REPORT_AFTER_MS};

impl SkuOwner {
    /// Updates the region's demand at `now_ms`, and what it reports: a
    /// spell of demand younger than [`RATE_REPORT_AFTER_MS`] reports none
    /// yet, as its first units say little of its rate (one unit in the
    /// meter's first 20 ms reads as 50/s in a region about to sell 2,000/s,
    /// and the coordinator would recall the region's units for others). Its
    /// first real figure asks for a sync at once.
    pub(super) fn measure(&mut self, now_ms: u64) {
        self.rate_per_s = self.demand_per_s(now_ms);
        if self.rate_per_s == 0.0 {
            self.woke_at_ms = None;
        } else if self.woke_at_ms.is_none() {
            self.woke_at_ms = Some(now_ms);
        }
        let was_silent = self.reported_rate_per_s == 0.0;
        self.reported_rate_per_s = match self.woke_at_ms {
            Some(at) if now_ms >= at + RATE_REPORT_AFTER_MS => self.rate_per_s,
            _ => 0.0,
        };
        self.sync_due |= was_silent && self.reported_rate_per_s > 0.0;
        let stops_at = if self.reported_rate_per_s > 0.0 && self.parked.is_empty() {
            self.rate.stops_at_ms(now_ms)
        } else {
            None
        };
        let stopped = stops_at.is_some_and(|at| now_ms >= at);
        // A spell that ends is news as much as one that starts: the units
        // kept here for its buyers can go to buyers waiting elsewhere.
        // Heard at the next tick and sync it came up to half a second
        // late (`bench tail --shape five-10k`).
        self.sync_due |= stopped && self.demand_stops_at_ms.is_some();
        self.demand_stops_at_ms = stops_at.filter(|_| !stopped);
    }

    /// The region's demand now: the meter's, except that buyers parked
    /// here waiting for units are demand still, however long ago they came.
    fn demand_per_s(&mut self, now_ms: u64) -> f64 {
        if self.parked.is_empty() {
            self.rate.demand_per_s(now_ms)
        } else {
            self.rate.rate_per_s(now_ms)
        }
    }
}
