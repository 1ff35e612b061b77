//! The coordinator's ledger of one SKU: the pool, units in transit to each
//! region, and each region's lease.
//!
//! `pool + sum(in_transit) + sum(leased) = total` at every step. A grant
//! moves units pool -> in transit (debit and outbox in one transaction); its
//! delivery moves them in transit -> leased; a return applied moves them
//! leased -> pool. Each method refuses rather than going negative and
//! asserts the invariant after moving.

use serde::Serialize;

use crate::ledger::LedgerError;

/// One region's quota as the coordinator sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RegionQuota {
    /// Units delivered to the region minus units it returned.
    pub leased: u64,
    /// Units granted and not yet acknowledged.
    pub in_transit: u64,
}

/// The coordinator's ledger of one SKU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolLedger {
    /// Units the SKU has in all.
    pub total: u64,
    /// Units not leased to any region.
    pub pool: u64,
    /// One entry per region, by index.
    pub regions: Vec<RegionQuota>,
}

impl PoolLedger {
    /// A new SKU with everything in the pool.
    pub fn new(total: u64, regions: usize) -> Self {
        Self {
            total,
            pool: total,
            regions: vec![RegionQuota::default(); regions],
        }
    }

    /// Units in transit to all regions.
    pub fn in_transit(&self) -> u64 {
        self.regions.iter().map(|r| r.in_transit).sum()
    }

    /// Whether `pool + in_transit + leased = total`.
    pub fn is_balanced(&self) -> bool {
        self.pool + self.in_transit() + self.regions.iter().map(|r| r.leased).sum::<u64>()
            == self.total
    }

    fn assert_balanced(&self) {
        assert!(self.is_balanced(), "pool ledger invariant broken: {self:?}");
    }

    /// Debits the pool for a grant to `region`.
    pub fn grant(&mut self, region: usize, units: u64) -> Result<(), LedgerError> {
        self.assert_balanced();
        if self.pool < units {
            return Err(LedgerError::InsufficientAvailable {
                available: self.pool,
                asked: units,
            });
        }
        self.pool -= units;
        self.regions[region].in_transit += units;
        self.assert_balanced();
        Ok(())
    }

    /// Records that `region` applied a grant of `units`.
    pub fn deliver(&mut self, region: usize, units: u64) -> Result<(), LedgerError> {
        self.assert_balanced();
        let r = &mut self.regions[region];
        if r.in_transit < units {
            return Err(LedgerError::InsufficientHeld {
                held: r.in_transit,
                asked: units,
            });
        }
        r.in_transit -= units;
        r.leased += units;
        self.assert_balanced();
        Ok(())
    }

    /// Credits the pool with a return from `region`.
    pub fn take_back(&mut self, region: usize, units: u64) -> Result<(), LedgerError> {
        self.assert_balanced();
        let r = &mut self.regions[region];
        if r.leased < units {
            return Err(LedgerError::InsufficientHeld {
                held: r.leased,
                asked: units,
            });
        }
        r.leased -= units;
        self.pool += units;
        self.assert_balanced();
        Ok(())
    }

    /// Adds new stock to the pool.
    pub fn add_stock(&mut self, units: u64) {
        self.total += units;
        self.pool += units;
        self.assert_balanced();
    }

    /// Removes stock, only from the pool.
    pub fn remove_stock(&mut self, units: u64) -> Result<(), LedgerError> {
        if self.pool < units {
            return Err(LedgerError::InsufficientAvailable {
                available: self.pool,
                asked: units,
            });
        }
        self.total -= units;
        self.pool -= units;
        self.assert_balanced();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a grant, its delivery and a return keep the total, and refusals change nothing.
    #[test]
    fn transfers_keep_the_total() {
        let mut l = PoolLedger::new(10, 2);
        l.grant(0, 6).unwrap();
        assert_eq!(l.in_transit(), 6);
        assert!(l.grant(1, 5).is_err());
        l.deliver(0, 6).unwrap();
        assert!(l.deliver(0, 1).is_err());
        l.take_back(0, 2).unwrap();
        assert!(l.take_back(1, 1).is_err());
        assert_eq!(l.pool, 6);
        assert!(l.remove_stock(7).is_err());
        l.remove_stock(6).unwrap();
        l.add_stock(1);
        assert_eq!((l.total, l.pool, l.regions[0].leased), (5, 1, 4));
    }
}
