//! A take: units a region's agent asks for synchronously when its buyers
//! need more than it has.

use super::{check_transfer, Allocation, AllocationError, Moves};
use crate::ids::TransferId;
use crate::policy::{decide_take, Policy};
use crate::protocol::{TakeRequest, TakeResponse};

/// What the driver's store holds under a take's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeHistory {
    /// Nothing: a new take.
    Unused,
    /// A grant of this SKU to this region, of these units: the take is repeated.
    GrantedHere(u64),
    /// Some other transfer.
    UsedElsewhere,
}

/// The result of a take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The answer to the agent.
    pub response: TakeResponse,
    /// Units newly granted by this take (0 for a repeat).
    pub granted: u64,
    /// What the rebalance after a short take did.
    pub moves: Moves,
}

impl Allocation {
    /// A take of units for `region`, asked synchronously by its agent.
    /// A repeated id gets its grant again; otherwise the pool grants what it
    /// can, and when units are free elsewhere the SKU is rebalanced so the
    /// policy asks for them back. Exhausted only when nothing is free anywhere.
    pub fn take(
        &mut self,
        region: usize,
        req: &TakeRequest,
        history: TakeHistory,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> TransferId,
    ) -> Result<Taken, AllocationError> {
        check_transfer("take", req.units)?;
        assert!(
            self.is_for(&req.tenant, &req.sku),
            "take routed to another SKU"
        );
        let answer = |grant, sold_out_everywhere, paused| TakeResponse {
            grant,
            sold_out_everywhere,
            paused,
        };
        match history {
            TakeHistory::UsedElsewhere => {
                return Err(AllocationError::Invalid(
                    "transfer id already used for something else".into(),
                ))
            }
            TakeHistory::GrantedHere(units) => {
                return Ok(Taken {
                    response: answer(Some(self.transfer(&req.id, units)), false, self.paused),
                    granted: 0,
                    moves: Moves::default(),
                })
            }
            TakeHistory::Unused => {}
        }
        if self.paused {
            return Ok(Taken {
                response: answer(None, false, true),
                granted: 0,
                moves: Moves::default(),
            });
        }
        // What the taker will still see or free: grants it has not credited
        // and returns that have not arrived (its own counters say).
        let r = &self.regions[region];
        let granted_ever = r.leased + r.returned + r.in_transit();
        let unseen = granted_ever
            .saturating_sub(req.received)
            .saturating_add(req.returned.saturating_sub(r.returned));
        let decision = decide_take(&self.policy_view(), region, req.units, req.prefetch, unseen);
        let grant = (decision.granted > 0).then(|| {
            self.grant(region, req.id.clone(), decision.granted);
            self.transfer(&req.id, decision.granted)
        });
        let moves = if !decision.sold_out_everywhere && decision.granted < req.units {
            self.rebalance_as(policy, new_id, true)
        } else {
            Moves::default()
        };
        Ok(Taken {
            response: answer(grant, decision.sold_out_everywhere, false),
            granted: decision.granted,
            moves,
        })
    }
}
