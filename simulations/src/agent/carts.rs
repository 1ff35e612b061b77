//! The agent's part in a cart, played as `region-agent/src/carts.rs`
//! plays it for one SKU: the gate's answer for an item, the item's units
//! set aside by the owner ([`Command::SetAside`]), the cart's rows of this
//! SKU written by the cart's own commit, and the owner told how the cart
//! ended ([`CartEnd`]). The cart itself, its commit and its lifecycle are
//! the shop's (`crate::shop`), which drives one agent per SKU and region.

use escrow_core::batch::{Batch, BatchOutcome};
use escrow_core::owner::{gate, CartEnd, Command, ReserveReply, ReserveRequest, Ticket};
use escrow_core::{Deadline, RequestKey};

use super::{Agent, Effect};

/// The bit that marks a ticket as a cart item's rather than a buyer's.
const CART_TICKET: Ticket = 1 << 63;

/// The ticket of a cart's item set aside for attempt `attempt`.
pub fn cart_ticket(attempt: u64) -> Ticket {
    CART_TICKET | attempt
}

/// The attempt a ticket names, if it is a cart item's.
pub fn cart_attempt(ticket: Ticket) -> Option<u64> {
    (ticket & CART_TICKET != 0).then_some(ticket & !CART_TICKET)
}

impl Agent {
    /// The gate's answer for `qty` units of this SKU, from memory: `None`
    /// when the item may be asked of the owner.
    pub fn gate_item(&self, qty: u64) -> Option<ReserveReply> {
        gate(&self.owner.gate_view(self.link_down), qty)
    }

    /// Asks the owner to set an item's units aside; the answer comes as
    /// [`Effect::CartItem`] (at once when the queue is full).
    pub fn set_aside(
        &mut self,
        now_us: u64,
        ticket: Ticket,
        request: ReserveRequest,
        deadline: Deadline,
        out: &mut Vec<Effect>,
    ) {
        assert!(self.up, "a down agent takes no requests");
        if self.queue.len() >= self.cfg.max_waiting {
            return out.push(Effect::CartItem {
                ticket,
                at_us: now_us + self.cfg.gate_us,
                reply: ReserveReply::QueueFull,
            });
        }
        self.queue.push_back(Command::SetAside {
            ticket,
            request,
            deadline,
        });
        self.pump(now_us, out);
    }

    /// Writes a cart commit's batch of this SKU (its item's row and the
    /// counters) to the database.
    pub fn write_cart_item(&mut self, batch: &Batch) -> BatchOutcome {
        self.db.commit(batch)
    }

    /// Tells the owner how a cart ended for its item `key`.
    pub fn cart_end(&mut self, now_us: u64, key: &RequestKey, end: CartEnd, out: &mut Vec<Effect>) {
        self.owner.handle_cart_end(key, end);
        self.pump(now_us, out);
    }
}
