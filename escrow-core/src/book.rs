//! A complete in-memory book of one SKU in one region.
//!
//! The region agent keeps reservations in its database and lets unique
//! indexes judge idempotency and the per-user limit; this book holds the same
//! rules in memory, so the property tests and the simulator can drive the
//! whole lifecycle without a database. Every method moves units only through
//! [`Ledger`] and [`Reservation`], the same code the agent uses.

use std::collections::{BTreeMap, HashMap};

use crate::batch::{Batch, BatchOutcome, StockChange};
use crate::ids::{RequestKey, Sku, SkuSettings, UserId};
use crate::ledger::Ledger;
use crate::reservation::{Reservation, Status, Transition};

/// One SKU's counters and reservations in one region.
#[derive(Debug, Clone)]
pub struct Book {
    /// The SKU this book is for.
    pub sku: Sku,
    /// The counters.
    pub ledger: Ledger,
    /// The admin's settings.
    pub settings: SkuSettings,
    /// Whether selling is stopped.
    pub paused: bool,
    reservations: BTreeMap<RequestKey, Reservation>,
    active_by_user: HashMap<UserId, RequestKey>,
}

impl Book {
    /// An empty book.
    pub fn new(sku: Sku, settings: SkuSettings) -> Self {
        Self {
            sku,
            ledger: Ledger::default(),
            settings,
            paused: false,
            reservations: BTreeMap::new(),
            active_by_user: HashMap::new(),
        }
    }

    /// The reservation created by `key`, if any.
    pub fn get(&self, key: &RequestKey) -> Option<&Reservation> {
        self.reservations.get(key)
    }

    /// All reservations, by key.
    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.reservations.values()
    }

    /// Commits an owner's batch the way the agent's store does, in the
    /// same order (transitions, changes, holds): every step is
    /// conditional, a hold is inserted only if its key and its user are
    /// free. Grants and returns are the caller's (they need transfer
    /// tables), as are mode changes. An `Err` means the owner decided
    /// something the book refuses: a bug, after which the book is not
    /// to be trusted.
    pub fn commit(&mut self, batch: &Batch) -> Result<BatchOutcome, String> {
        for (key, qty, change) in &batch.transitions {
            let r = self
                .reservations
                .get_mut(key)
                .ok_or_else(|| format!("transition of unknown key {key}"))?;
            // The store's conditions: an expiry finds the hold due, any
            // other change finds it not yet due.
            let due = r.is_due(batch.now_ms);
            if r.status != Status::Held || r.qty != *qty || due != (*change == Transition::Expire) {
                return Err(format!("{change:?} of {key} found it {:?}", r.status));
            }
            change
                .apply_to_ledger(&mut self.ledger, *qty)
                .map_err(|e| e.to_string())?;
            r.apply(*change);
            if !r.status.is_active() {
                self.active_by_user.remove(&r.user_id);
            }
        }
        for change in &batch.changes {
            match *change {
                StockChange::Receive(units) => self.ledger.receive(units),
                StockChange::Return(units) => {
                    self.ledger.return_units(units).map_err(|e| e.to_string())?;
                }
                StockChange::Settings(settings) => self.settings = settings,
                StockChange::Pause(paused) => self.paused = paused,
                StockChange::Mode(_) => {}
            }
        }
        let mut inserted = Vec::with_capacity(batch.holds.len());
        for hold in &batch.holds {
            if self.reservations.contains_key(&hold.request_key)
                || self.active_by_user.contains_key(&hold.user_id)
            {
                inserted.push(false);
                continue;
            }
            self.ledger
                .hold(hold.qty.units())
                .map_err(|e| e.to_string())?;
            let reservation = hold.reservation(&self.sku);
            self.active_by_user
                .insert(hold.user_id.clone(), hold.request_key.clone());
            self.reservations
                .insert(hold.request_key.clone(), reservation);
            inserted.push(true);
        }
        Ok(BatchOutcome {
            inserted,
            applied_grants: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::batch::NewHold;
    use crate::ids::{Qty, Tenant, TtlMs};
    use crate::reservation::Verdict;

    #[derive(Debug, Clone)]
    enum Op {
        Hold {
            key: u8,
            user: u8,
            qty: u32,
            ttl_s: u8,
        },
        Confirm(u8),
        Release(u8),
        Extend(u8, u8),
        Sweep,
        Advance(u16),
        Receive(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..40u8, 0..12u8, 1..=3u32, 1..20u8)
                .prop_map(|(key, user, qty, ttl_s)| Op::Hold { key, user, qty, ttl_s }),
            2 => (0..40u8).prop_map(Op::Confirm),
            2 => (0..40u8).prop_map(Op::Release),
            1 => (0..40u8, 1..20u8).prop_map(|(k, s)| Op::Extend(k, s)),
            1 => Just(Op::Sweep),
            2 => (0..5_000u16).prop_map(Op::Advance),
            1 => (0..4u8).prop_map(Op::Receive),
        ]
    }

    fn key(k: u8) -> RequestKey {
        RequestKey::parse(&format!("key-{k}")).unwrap()
    }

    fn batch(now_ms: u64) -> Batch {
        Batch::new(
            Tenant::parse("t").unwrap(),
            Sku::parse("sku").unwrap(),
            now_ms,
        )
    }

    /// Sum of units in reservations of one status.
    fn units_in(book: &Book, status: Status) -> u64 {
        book.reservations()
            .filter(|r| r.status == status)
            .map(|r| r.qty.units())
            .sum()
    }

    /// Decides a buyer action on the committed row as the owner does and
    /// commits its transition, if any.
    fn act(book: &mut Book, k: u8, now: u64, decide: impl Fn(&Reservation) -> Verdict) {
        let Some(row) = book.get(&key(k)).cloned() else {
            return;
        };
        if let Some(change) = decide(&row).change {
            let mut b = batch(now);
            b.transitions.push((key(k), row.qty, change));
            book.commit(&b)
                .expect("a decided transition of a HELD row commits");
        }
    }

    proptest! {
        /// Goal: under any sequence of holds, actions decided on the rows,
        /// sweeps, clock moves and new stock, committed as batches, the
        /// ledger stays balanced, its held/sold counters equal the units in
        /// HELD/SOLD rows (no unit returned twice or lost), a key never
        /// yields two rows, no user holds two, and a sweep never expires a
        /// hold twice.
        #[test]
        fn random_batches_keep_every_invariant(ops in proptest::collection::vec(op(), 1..200)) {
            let settings = SkuSettings::parse(Some(3), Some(5_000)).unwrap();
            let mut book = Book::new(Sku::parse("sku").unwrap(), settings);
            book.ledger.receive(10);
            let mut now = 1_000_000u64;
            for op in ops {
                let before = book.ledger;
                match op {
                    Op::Hold { key: k, user, qty, ttl_s } => {
                        let qty = Qty::parse(qty.into(), 3).unwrap();
                        if qty.units() > book.ledger.available {
                            continue;
                        }
                        let user = UserId::parse(&format!("user-{user}")).unwrap();
                        let free = book.get(&key(k)).is_none()
                            && !book.reservations().any(|r| r.user_id == user && r.status.is_active());
                        let mut b = batch(now);
                        b.holds.push(NewHold {
                            borrow: None,
                            request_key: key(k),
                            user_id: user,
                            qty,
                            expires_at_ms: now + u64::from(ttl_s) * 1_000,
                        });
                        let out = book.commit(&b).unwrap();
                        prop_assert_eq!(out.inserted, vec![free]);
                        let held = if free { qty.units() } else { 0 };
                        prop_assert_eq!(book.ledger.available + held, before.available);
                    }
                    Op::Confirm(k) => act(&mut book, k, now, |r| r.confirm(now)),
                    Op::Release(k) => act(&mut book, k, now, |r| r.release(now)),
                    Op::Extend(k, s) => {
                        let ttl = TtlMs::parse(i64::from(s) * 1_000).unwrap();
                        act(&mut book, k, now, |r| r.extend(now, ttl));
                    }
                    Op::Sweep => {
                        let mut b = batch(now);
                        b.transitions = book
                            .reservations()
                            .filter(|r| r.is_due(now))
                            .map(|r| (r.request_key.clone(), r.qty, Transition::Expire))
                            .collect();
                        let back: u64 = b.transitions.iter().map(|(_, q, _)| q.units()).sum();
                        book.commit(&b).unwrap();
                        prop_assert_eq!(book.ledger.available, before.available + back);
                        prop_assert!(b.transitions.is_empty() || book.commit(&b).is_err(), "a second expiry of a hold is refused");
                    }
                    Op::Advance(ms) => now += u64::from(ms),
                    Op::Receive(n) => {
                        let mut b = batch(now);
                        b.changes.push(StockChange::Receive(n.into()));
                        book.commit(&b).unwrap();
                    }
                }
                prop_assert!(book.ledger.is_balanced());
                prop_assert_eq!(book.ledger.held, units_in(&book, Status::Held));
                prop_assert_eq!(book.ledger.sold, units_in(&book, Status::Sold));
                let mut users = std::collections::HashSet::new();
                for r in book.reservations().filter(|r| r.status.is_active()) {
                    prop_assert!(users.insert(r.user_id.clone()), "one active reservation per user");
                }
            }
        }
    }

    /// Goal: a transition the rows do not allow is refused, as the store's
    /// conditional update refuses it (negative control): expiring a hold
    /// not yet due, confirming a hold that already expired.
    #[test]
    fn a_transition_of_a_row_no_longer_held_is_refused() {
        let mut book = Book::new(Sku::parse("s").unwrap(), SkuSettings::default());
        book.ledger.receive(1);
        let mut b = batch(0);
        b.holds.push(NewHold {
            borrow: None,
            request_key: key(1),
            user_id: UserId::parse("u").unwrap(),
            qty: Qty::ONE,
            expires_at_ms: 1_000,
        });
        assert_eq!(book.commit(&b).unwrap().inserted, vec![true]);
        let mut early = batch(999);
        early
            .transitions
            .push((key(1), Qty::ONE, Transition::Expire));
        assert!(
            book.commit(&early).is_err(),
            "a hold not yet due does not expire"
        );
        let mut sweep = batch(1_000);
        sweep
            .transitions
            .push((key(1), Qty::ONE, Transition::Expire));
        book.commit(&sweep).unwrap();
        assert_eq!(book.ledger.available, 1);
        let mut confirm = batch(1_000);
        confirm
            .transitions
            .push((key(1), Qty::ONE, Transition::Confirm));
        assert!(book.commit(&confirm).is_err());
        assert_eq!(book.get(&key(1)).unwrap().status, Status::Expired);
    }
}
