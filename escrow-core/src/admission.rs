//! Admission: which queued requests a batch serves, and in what way.
//!
//! The owner of a SKU drains its queue into a batch, drops requests that
//! waited past their deadline (answered before anything was written, so a
//! retry with the same key is safe), and offers the remaining reserve
//! requests the units it believes available. Requests that do not fit are
//! kept as overflow rather than refused: if some of this batch's holds turn
//! out to be replays or user-limit hits, their units are still free and the
//! overflow is tried again, so nobody hears SOLD_OUT while a unit is left.

/// A point in time after which a queued request is refused unserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline {
    /// ms since the epoch.
    pub at_ms: u64,
}

impl Deadline {
    /// The deadline of a request queued at `now_ms` that may wait `wait_timeout_ms`.
    pub fn after(now_ms: u64, wait_timeout_ms: u64) -> Self {
        Self {
            at_ms: now_ms.saturating_add(wait_timeout_ms),
        }
    }

    /// Whether the request waited too long to be served at `now_ms`.
    pub fn passed(self, now_ms: u64) -> bool {
        now_ms > self.at_ms
    }
}

/// Which reserve requests of a batch try to hold units.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReservePlan {
    /// Indices (into the batch) that try to hold, in order.
    pub try_hold: Vec<usize>,
    /// Indices that did not fit in what is available.
    pub overflow: Vec<usize>,
    /// Units the `try_hold` requests would take if all are new.
    pub units: u64,
}

/// First fit in arrival order: each request whose quantity still fits in
/// `available` tries to hold; a larger request does not block a smaller one
/// behind it.
pub fn plan_reserves(available: u64, quantities: &[u64]) -> ReservePlan {
    let mut plan = ReservePlan::default();
    let mut left = available;
    for (index, &qty) in quantities.iter().enumerate() {
        if qty <= left {
            left -= qty;
            plan.units += qty;
            plan.try_hold.push(index);
        } else {
            plan.overflow.push(index);
        }
    }
    assert_eq!(plan.units + left, available);
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a batch never plans more units than available, and small requests fill gaps.
    #[test]
    fn plans_first_fit_within_available() {
        let plan = plan_reserves(3, &[2, 2, 1, 1]);
        assert_eq!(plan.try_hold, vec![0, 2]);
        assert_eq!(plan.overflow, vec![1, 3]);
        assert_eq!(plan.units, 3);
        assert_eq!(plan_reserves(0, &[1]).overflow, vec![0]);
    }

    /// Goal: a deadline passes strictly after its instant.
    #[test]
    fn deadline_passes_after_its_instant() {
        let d = Deadline::after(100, 50);
        assert!(!d.passed(150));
        assert!(d.passed(151));
    }
}
