//! What a shop (`crate::shop`) does with the world of one of its SKUs:
//! step it in the shop's time order, hand an item to one of its agents,
//! write a cart's rows of this SKU, and collect the items' answers. Every
//! change is checked as the world's own events are.

use escrow_core::batch::Batch;
use escrow_core::owner::{CartEnd, ReserveRequest};
use escrow_core::{Deadline, RequestKey};

use super::*;

impl World {
    /// When the world's next event is due, µs.
    pub fn next_time(&self) -> Option<u64> {
        self.queue.peek_time()
    }

    /// Runs the next event and checks safety.
    pub fn step_checked(&mut self) -> Result<(), Violation> {
        self.step();
        self.check()?;
        self.after_event();
        Ok(())
    }

    /// Brings the world's clock to `t_us`, when the shop acts on it.
    fn advance_to(&mut self, t_us: u64) {
        assert!(t_us >= self.now_us, "time never runs backwards");
        self.now_us = t_us;
    }

    /// The SKU this world sells.
    pub fn sku(&self) -> &Sku {
        &self.agents[0].db.book.sku
    }

    /// Whether region `r`'s agent runs, and its incarnation.
    pub fn agent_epoch(&self, r: usize) -> Option<u32> {
        self.agents[r].up.then_some(self.agents[r].epoch)
    }

    /// Asks region `r`'s agent to set an item's units aside at `t_us`.
    pub fn set_aside(
        &mut self,
        t_us: u64,
        r: usize,
        ticket: escrow_core::owner::Ticket,
        request: ReserveRequest,
        deadline: Deadline,
    ) -> Result<(), Violation> {
        self.advance_to(t_us);
        self.agents[r].set_aside(t_us, ticket, request, deadline, &mut self.effects);
        self.apply_effects();
        self.check()
    }

    /// Writes a cart commit's batch of this SKU in region `r` at `t_us`.
    pub fn write_cart_item(&mut self, t_us: u64, r: usize, batch: &Batch) -> Result<(), Violation> {
        self.advance_to(t_us);
        let outcome = self.agents[r].write_cart_item(batch);
        if outcome.inserted.iter().any(|inserted| !inserted) {
            return Err(self.violation(format!(
                "region {r}: a cart item set aside by the owner was refused by the database"
            )));
        }
        self.check()
    }

    /// Tells region `r`'s owner at `t_us` how a cart ended for item `key`.
    pub fn cart_end(
        &mut self,
        t_us: u64,
        r: usize,
        key: &RequestKey,
        end: CartEnd,
    ) -> Result<(), Violation> {
        self.advance_to(t_us);
        self.agents[r].cart_end(t_us, key, end, &mut self.effects);
        self.apply_effects();
        self.check()
    }

    /// The items' answers given since the last call: (ticket, when, answer).
    pub fn take_cart_replies(&mut self) -> Vec<(escrow_core::owner::Ticket, u64, ReserveReply)> {
        std::mem::take(&mut self.cart_replies)
    }

    /// Units free anywhere for this SKU right now (pool, in transit,
    /// available in a region).
    pub fn units_free(&self) -> u64 {
        self.free_units()
    }

    /// Adds what another SKU's world recorded to this one's recorder.
    pub fn absorb_recorder(&mut self, other: &World) {
        self.rec.absorb(&other.rec);
    }

    /// Ends every fault at `t_us` (the shop's liveness phase).
    pub fn heal_at(&mut self, t_us: u64) {
        self.advance_to(t_us);
        self.heal();
    }
}
