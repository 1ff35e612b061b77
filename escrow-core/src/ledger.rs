//! A region's counters for one SKU and the invariant that binds them.
//!
//! `available + held + sold = received - returned` at every step: stock
//! enters a region only as `received` (a grant, or an admin adding stock in
//! standalone mode) and leaves only as `returned` or as `sold`. Each method
//! checks its precondition and refuses rather than going negative, then
//! asserts the invariant, so a bug crashes loudly instead of selling on.

use serde::Serialize;

/// Why a counter move was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Fewer units available than asked for.
    #[error("only {available} units available, {asked} asked")]
    InsufficientAvailable {
        /// Units available.
        available: u64,
        /// Units asked for.
        asked: u64,
    },
    /// Fewer units held than the move would take out of `held`.
    #[error("only {held} units held, {asked} asked")]
    InsufficientHeld {
        /// Units held.
        held: u64,
        /// Units asked for.
        asked: u64,
    },
}

/// Per-SKU counters of one region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    /// Units that may be held right now.
    pub available: u64,
    /// Units in HELD reservations.
    pub held: u64,
    /// Units in SOLD reservations.
    pub sold: u64,
    /// All units ever received by this region.
    pub received: u64,
    /// All units this region ever gave back.
    pub returned: u64,
}

impl Ledger {
    /// Whether `available + held + sold = received - returned`.
    pub fn is_balanced(&self) -> bool {
        self.received >= self.returned
            && self.available + self.held + self.sold == self.received - self.returned
    }

    /// The region's share of the total: what it received minus what it gave back.
    pub fn quota(&self) -> u64 {
        self.received - self.returned
    }

    fn assert_balanced(&self) {
        assert!(self.is_balanced(), "ledger invariant broken: {self:?}");
    }

    /// Moves `units` from available to held (a new reservation).
    pub fn hold(&mut self, units: u64) -> Result<(), LedgerError> {
        self.shift(units, Counter::Available, Counter::Held)
    }

    /// Moves `units` from held to sold (a confirmation).
    pub fn sell(&mut self, units: u64) -> Result<(), LedgerError> {
        self.shift(units, Counter::Held, Counter::Sold)
    }

    /// Moves `units` from held back to available (a release or an expiry).
    pub fn unhold(&mut self, units: u64) -> Result<(), LedgerError> {
        self.shift(units, Counter::Held, Counter::Available)
    }

    /// Adds `units` of new quota to available.
    pub fn receive(&mut self, units: u64) {
        self.assert_balanced();
        self.received += units;
        self.available += units;
        self.assert_balanced();
    }

    /// Gives `units` of available quota back (lower the total, or return to the pool).
    pub fn return_units(&mut self, units: u64) -> Result<(), LedgerError> {
        self.shift(units, Counter::Available, Counter::Returned)
    }

    /// The one move between counters: `units` out of `from` into `to`,
    /// refused (nothing changed) if `from` has fewer.
    fn shift(&mut self, units: u64, from: Counter, to: Counter) -> Result<(), LedgerError> {
        self.assert_balanced();
        let have = *self.counter(from);
        if have < units {
            return Err(match from {
                Counter::Available => LedgerError::InsufficientAvailable {
                    available: have,
                    asked: units,
                },
                Counter::Held => LedgerError::InsufficientHeld {
                    held: have,
                    asked: units,
                },
                Counter::Sold | Counter::Returned => {
                    unreachable!("units never move out of {from:?}")
                }
            });
        }
        *self.counter(from) -= units;
        *self.counter(to) += units;
        self.assert_balanced();
        Ok(())
    }

    fn counter(&mut self, counter: Counter) -> &mut u64 {
        match counter {
            Counter::Available => &mut self.available,
            Counter::Held => &mut self.held,
            Counter::Sold => &mut self.sold,
            Counter::Returned => &mut self.returned,
        }
    }
}

/// The counters units move between; `received` only grows, by
/// [`Ledger::receive`].
#[derive(Debug, Clone, Copy)]
enum Counter {
    Available,
    Held,
    Sold,
    Returned,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every move keeps the invariant and a refused move changes nothing.
    #[test]
    fn moves_keep_the_invariant_and_refusals_change_nothing() {
        let mut l = Ledger::default();
        l.receive(3);
        l.hold(2).unwrap();
        assert_eq!(
            l.hold(2),
            Err(LedgerError::InsufficientAvailable {
                available: 1,
                asked: 2
            })
        );
        l.sell(1).unwrap();
        l.unhold(1).unwrap();
        assert_eq!(
            l.unhold(1),
            Err(LedgerError::InsufficientHeld { held: 0, asked: 1 })
        );
        l.return_units(2).unwrap();
        assert_eq!(
            l,
            Ledger {
                available: 0,
                held: 0,
                sold: 1,
                received: 3,
                returned: 2
            }
        );
        assert!(l.is_balanced());
        assert_eq!(l.quota(), 1);
    }
}
