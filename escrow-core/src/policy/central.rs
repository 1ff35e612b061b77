//! Central mode: every free unit in the pool, and [`CentralOnly`], the
//! policy that sells that way from the start.

use super::{Plan, Policy, SkuState};

/// In central mode every free unit belongs in the pool: recall all of it.
pub(super) fn central_plan(sku: &SkuState) -> Plan {
    Plan {
        grants: Vec::new(),
        recalls: sku
            .regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.available > r.recall_pending)
            .map(|(i, r)| (i, r.available - r.recall_pending))
            .collect(),
        central: true,
    }
}

/// Every sale asks the coordinator: all units stay in the pool.
#[derive(Debug, Clone, Default)]
pub struct CentralOnly;

impl Policy for CentralOnly {
    fn name(&self) -> &'static str {
        "central"
    }
    fn initial_split(&self, _total: u64, weights: &[u32]) -> Vec<u64> {
        vec![0; weights.len()]
    }
    fn plan(&self, sku: &SkuState) -> Plan {
        central_plan(sku)
    }
    fn starts_central(&self) -> bool {
        true
    }
}
