//! The world's safety checks, run after every event from ground truth:
//! where every unit is, the invariant per region and overall, the audit,
//! nothing held or sold beyond the total, and under a global per-user limit
//! one place per user.

use std::collections::HashMap;

use escrow_core::UserLimitScope;

use super::*;

impl World {
    /// Ground truth: units free anywhere right now.
    pub(super) fn free_units(&self) -> u64 {
        let mut free = self.coordinator.allocation().pool;
        for (r, a) in self.agents.iter().enumerate() {
            // A batch in commit may hold units of a grant it credits: take
            // its holds from the region's whole, not from its stored available.
            free += (a.db.book.ledger.available
                + self.grants_in_flight(r)
                + a.returns_in_flight(&self.coordinator.applied_returns[r]))
            .saturating_sub(a.units_being_held());
        }
        free
    }

    pub(super) fn grants_in_flight(&self, r: usize) -> u64 {
        let applied = &self.agents[r].db.applied_grants;
        self.coordinator.allocation().regions[r]
            .grants
            .iter()
            .filter(|(id, _)| !applied.contains(*id))
            .map(|(_, u)| *u)
            .sum()
    }

    pub(super) fn compute_census(&self) -> Census {
        let mut c = Census {
            pool: self.coordinator.allocation().pool,
            ..Census::default()
        };
        for (r, a) in self.agents.iter().enumerate() {
            let l = a.db.book.ledger;
            c.in_transit += self.grants_in_flight(r)
                + a.returns_in_flight(&self.coordinator.applied_returns[r]);
            c.available += l.available;
            c.held += l.held;
            c.sold += l.sold;
        }
        c
    }

    /// Checks every safety property; on failure names the seed.
    pub(super) fn check(&mut self) -> Result<(), Violation> {
        let total = self.coordinator.allocation().total;
        if !self.coordinator.allocation().is_balanced() {
            return Err(self.violation(format!(
                "pool ledger unbalanced: {:?}",
                self.coordinator.allocation()
            )));
        }
        for (r, a) in self.agents.iter().enumerate() {
            let l = a.db.book.ledger;
            if !l.is_balanced() {
                return Err(self.violation(format!("region {r} ledger unbalanced: {l:?}")));
            }
            let grants = self.grants_in_flight(r);
            let returns = a.returns_in_flight(&self.coordinator.applied_returns[r]);
            let q = &self.coordinator.allocation().regions[r];
            if q.leased + q.in_transit() != l.quota() + grants + returns {
                return Err(self.violation(format!(
                    "region {r}: coordinator has leased {} + in transit {}, agent has quota {} \
                     + grants in flight {grants} + returns in flight {returns}",
                    q.leased,
                    q.in_transit(),
                    l.quota()
                )));
            }
        }
        let c = self.compute_census();
        if c.pool + c.in_transit + c.available + c.held + c.sold != total {
            return Err(self.violation(format!(
                "units created or destroyed: pool {} + in transit {} + available {} + held {} + sold {} != total {total}",
                c.pool, c.in_transit, c.available, c.held, c.sold
            )));
        }
        let drift = self.coordinator.drift();
        if drift != 0 {
            return Err(self.violation(format!(
                "audit over the coordinator's view drifts by {drift}"
            )));
        }
        let over = (c.held + c.sold)
            .saturating_sub(total)
            .max(self.sold_to_buyers.saturating_sub(total));
        if over > 0 {
            self.oversold = self.oversold.max(over);
            return Err(self.violation(format!("oversold by {over} units")));
        }
        if self.sold_to_buyers > c.sold {
            return Err(self.violation(format!(
                "buyers confirmed {} units but books record {} sold",
                self.sold_to_buyers, c.sold
            )));
        }
        self.census = c;
        self.check_users()
    }

    /// Under a global per-user limit: no user holds or has bought in two
    /// regions, and no home holds for a user whose place it lent. Checked
    /// again only after a database write, the only thing that changes it.
    fn check_users(&mut self) -> Result<(), Violation> {
        if self.scenario.sku.user_limit_scope != UserLimitScope::Global {
            return Ok(());
        }
        let writes = self.agents.iter().map(|a| a.db.writes).sum();
        if writes == self.users_checked_at {
            return Ok(());
        }
        self.users_checked_at = writes;
        let mut places: HashMap<&escrow_core::UserId, usize> = HashMap::new();
        for (r, a) in self.agents.iter().enumerate() {
            let active =
                a.db.book
                    .reservations()
                    .filter(|res| res.status.is_active());
            for res in active {
                let user = &res.user_id;
                if let Some(first) = places.insert(user, r) {
                    return Err(self.violation(format!(
                        "user {user} holds in regions {first} and {r} under a global limit"
                    )));
                }
                if a.db.has_lent(user) {
                    return Err(self.violation(format!(
                        "region {r} holds for user {user}, whose place it lent"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks, at the end, that every book's counters match its reservations.
    pub fn check_books(&self) -> Result<(), Violation> {
        use escrow_core::Status;
        for (r, a) in self.agents.iter().enumerate() {
            let (mut held, mut sold) = (0, 0);
            for res in a.db.book.reservations() {
                match res.status {
                    Status::Held => held += res.qty.units(),
                    Status::Sold => sold += res.qty.units(),
                    Status::Released | Status::Expired => {}
                }
            }
            let l = a.db.book.ledger;
            if (held, sold) != (l.held, l.sold) {
                return Err(self.violation(format!(
                    "region {r}: reservations hold {held} and sold {sold}, ledger says {} and {}",
                    l.held, l.sold
                )));
            }
        }
        Ok(())
    }
}
