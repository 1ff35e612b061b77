//! The answers a request handler gives before a request reaches the owner.
//!
//! Sold out must be the cheapest answer: it is decided from what the owner
//! last published, without a queue or a database. Both the agent's HTTP
//! handler and the simulator's call [`gate`].

use super::messages::{PauseReason, ReserveReply};

/// What the handler knows of a SKU without asking its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateView {
    /// Units available as of the owner's last commit.
    pub available: u64,
    /// Paused by an admin.
    pub paused: bool,
    /// Halted by the agent (drift, fencing, failed commit, owner gone).
    pub halted: bool,
    /// The SKU sells in central mode.
    pub central: bool,
    /// The agent has a coordinator (not standalone).
    pub coordinated: bool,
    /// The agent's last call to the coordinator failed.
    pub link_down: bool,
    /// The coordinator said no unit is free anywhere.
    pub sold_out_everywhere: bool,
}

/// The answer to a reserve of `qty` units that needs no owner, if any.
///
/// Standalone, the region's stock is all there is; with a coordinator, only
/// its word that nothing is free anywhere makes a sale sold out. In central
/// mode every sale needs the coordinator, so an unreachable one pauses.
/// A halt is named before an admin pause: it is the one an operator must
/// repair.
pub fn gate(view: &GateView, qty: u64) -> Option<ReserveReply> {
    if view.halted {
        return Some(ReserveReply::Paused(PauseReason::Halted));
    }
    if view.paused {
        return Some(ReserveReply::Paused(PauseReason::AdminPause));
    }
    if view.central && view.link_down {
        return Some(ReserveReply::Paused(PauseReason::CoordinatorUnreachable));
    }
    if view.available < qty && (!view.coordinated || view.sold_out_everywhere) {
        return Some(ReserveReply::SoldOut);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> GateView {
        GateView {
            available: 0,
            paused: false,
            halted: false,
            central: false,
            coordinated: true,
            link_down: false,
            sold_out_everywhere: false,
        }
    }

    /// Goal: a coordinated region short of units sends the request on
    /// unless the coordinator said nothing is free anywhere.
    #[test]
    fn short_region_asks_unless_sold_out_everywhere() {
        assert_eq!(gate(&open(), 1), None);
        let sold_out = GateView {
            sold_out_everywhere: true,
            ..open()
        };
        assert_eq!(gate(&sold_out, 1), Some(ReserveReply::SoldOut));
        let standalone = GateView {
            coordinated: false,
            ..open()
        };
        assert_eq!(gate(&standalone, 1), Some(ReserveReply::SoldOut));
        let stocked = GateView {
            available: 1,
            ..standalone
        };
        assert_eq!(gate(&stocked, 1), None);
    }

    /// Goal: paused or halted SKUs and central mode without a coordinator
    /// pause, each with its own reason.
    #[test]
    fn stopped_or_cut_off_central_pauses() {
        let paused = GateView {
            paused: true,
            available: 5,
            ..open()
        };
        let admin = Some(ReserveReply::Paused(PauseReason::AdminPause));
        assert_eq!(gate(&paused, 1), admin);
        let halted = GateView {
            halted: true,
            ..paused
        };
        let halt = Some(ReserveReply::Paused(PauseReason::Halted));
        assert_eq!(gate(&halted, 1), halt);
        let cut_off = GateView {
            central: true,
            link_down: true,
            ..open()
        };
        let unreachable = Some(ReserveReply::Paused(PauseReason::CoordinatorUnreachable));
        assert_eq!(gate(&cut_off, 1), unreachable);
    }
}
