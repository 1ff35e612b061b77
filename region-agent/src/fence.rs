//! This process's hold on its region: the epoch it writes with, and whether
//! a newer process took the region away.
//!
//! Once fenced, a process never writes again; it answers 503 PAUSED until an
//! operator stops it. Restarting it takes a fresh epoch (and fences the
//! other one), which is the operator's deliberate choice.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::store::Epoch;

/// The region lease as this process sees it.
#[derive(Debug)]
pub struct Fence {
    epoch: Epoch,
    fenced: AtomicBool,
}

impl Fence {
    /// A lease just taken with `epoch`.
    pub fn new(epoch: Epoch) -> Self {
        // Exported from the start, so a healthy process shows 0 and a
        // missing series means a process that is not scraped.
        metrics::gauge!("escrow_fenced").set(0.0);
        Self {
            epoch,
            fenced: AtomicBool::new(false),
        }
    }

    /// The epoch every write carries.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether a newer process holds the region.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Records that the store refused our epoch.
    pub fn set_fenced(&self) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(
                epoch = self.epoch.0,
                "FENCED: another agent took this region's lease; this process no longer writes"
            );
            metrics::gauge!("escrow_fenced").set(1.0);
        }
    }
}
