//! A complete in-memory book of one SKU in one region.
//!
//! The region agent keeps reservations in its database and lets unique
//! indexes judge idempotency and the per-user limit; this book holds the same
//! rules in memory, so the property tests and the simulator can drive the
//! whole lifecycle without a database. Every method moves units only through
//! [`Ledger`] and [`Reservation`], the same code the agent uses.

use std::collections::{BTreeMap, HashMap};

use crate::batch::{Batch, BatchOutcome, StockChange};
use crate::ids::{Qty, RequestKey, Sku, SkuSettings, TtlMs, UserId};
use crate::ledger::Ledger;
use crate::reservation::{Reservation, Status, Transition, Verdict};

/// The answer to a reserve request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// A new hold was created.
    Held(Reservation),
    /// The key already had this reservation; here is its current state.
    Replay(Reservation),
    /// Not enough units available; nothing written.
    SoldOut,
    /// The user already has an active reservation of this SKU; nothing written.
    UserLimit,
    /// The key belongs to a request for another user, SKU or quantity.
    KeyReused,
    /// The SKU is paused; nothing written.
    Paused,
}

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

    /// Reserve `qty` units for `user` under `key`, holding them for `ttl`
    /// (the SKU's default when `None`).
    pub fn reserve(
        &mut self,
        key: RequestKey,
        user: UserId,
        qty: Qty,
        ttl: Option<TtlMs>,
        now_ms: u64,
    ) -> ReserveOutcome {
        if let Some(existing) = self.reservations.get(&key) {
            if existing.user_id == user && existing.qty == qty {
                return ReserveOutcome::Replay(existing.clone());
            }
            return ReserveOutcome::KeyReused;
        }
        if self.paused {
            return ReserveOutcome::Paused;
        }
        if self.active_by_user.contains_key(&user) {
            return ReserveOutcome::UserLimit;
        }
        if self.ledger.hold(qty.units()).is_err() {
            return ReserveOutcome::SoldOut;
        }
        let reservation = Reservation {
            request_key: key.clone(),
            user_id: user.clone(),
            sku: self.sku.clone(),
            qty,
            status: Status::Held,
            expires_at_ms: now_ms + ttl.unwrap_or(self.settings.hold_ttl).get(),
            extended: false,
        };
        self.active_by_user.insert(user, key.clone());
        self.reservations.insert(key, reservation.clone());
        ReserveOutcome::Held(reservation)
    }

    /// Confirm the reservation of `key`; `None` if there is none.
    pub fn confirm(&mut self, key: &RequestKey, now_ms: u64) -> Option<(Verdict, Reservation)> {
        self.act(key, |r| r.confirm(now_ms))
    }

    /// Release the reservation of `key`; `None` if there is none.
    pub fn release(&mut self, key: &RequestKey, now_ms: u64) -> Option<(Verdict, Reservation)> {
        self.act(key, |r| r.release(now_ms))
    }

    /// Extend the reservation of `key`; `None` if there is none.
    pub fn extend(
        &mut self,
        key: &RequestKey,
        ttl: TtlMs,
        now_ms: u64,
    ) -> Option<(Verdict, Reservation)> {
        self.act(key, |r| r.extend(now_ms, ttl))
    }

    /// Expire every due hold; returns the units that went back to available.
    pub fn expire_due(&mut self, now_ms: u64) -> u64 {
        let due: Vec<RequestKey> = self
            .reservations
            .values()
            .filter(|r| r.is_due(now_ms))
            .map(|r| r.request_key.clone())
            .collect();
        let mut units = 0;
        for key in due {
            if let Some((verdict, r)) = self.act(&key, |r| r.expire(now_ms)) {
                if verdict.change.is_some() {
                    units += r.qty.units();
                }
            }
        }
        units
    }

    /// Commits an owner's batch the way the agent's store does, in the
    /// same order (transitions, sweep, changes, holds): every step is
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
            if r.status != Status::Held || r.qty != *qty {
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
        let mut expired = Vec::new();
        if batch.sweep {
            let due: Vec<RequestKey> = self
                .reservations
                .values()
                .filter(|r| r.is_due(batch.now_ms))
                .map(|r| r.request_key.clone())
                .collect();
            for key in due {
                if let Some((verdict, r)) = self.act(&key, |r| r.expire(batch.now_ms)) {
                    if verdict.change == Some(Transition::Expire) {
                        expired.push((key, r.qty));
                    }
                }
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
            expired,
            applied_grants: Vec::new(),
        })
    }

    fn act(
        &mut self,
        key: &RequestKey,
        decide: impl FnOnce(&Reservation) -> Verdict,
    ) -> Option<(Verdict, Reservation)> {
        let reservation = self.reservations.get_mut(key)?;
        let verdict = decide(reservation);
        if let Some(change) = verdict.change {
            change
                .apply_to_ledger(&mut self.ledger, reservation.qty)
                .expect("a HELD reservation's units are in held");
            reservation.apply(change);
            if !reservation.status.is_active() {
                self.active_by_user.remove(&reservation.user_id);
            }
        }
        Some((verdict, reservation.clone()))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Reserve {
            key: u8,
            user: u8,
            qty: u32,
            ttl_s: Option<u8>,
        },
        Confirm(u8),
        Release(u8),
        Extend(u8, u8),
        Expire,
        Advance(u16),
        Receive(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..40u8, 0..12u8, 1..=3u32, proptest::option::of(1..20u8))
                .prop_map(|(key, user, qty, ttl_s)| Op::Reserve { key, user, qty, ttl_s }),
            2 => (0..40u8).prop_map(Op::Confirm),
            2 => (0..40u8).prop_map(Op::Release),
            1 => (0..40u8, 1..20u8).prop_map(|(k, s)| Op::Extend(k, s)),
            1 => Just(Op::Expire),
            2 => (0..5_000u16).prop_map(Op::Advance),
            1 => (0..4u8).prop_map(Op::Receive),
        ]
    }

    fn key(k: u8) -> RequestKey {
        RequestKey::parse(&format!("key-{k}")).unwrap()
    }

    /// Sum of units in reservations of one status.
    fn units_in(book: &Book, status: Status) -> u64 {
        book.reservations()
            .filter(|r| r.status == status)
            .map(|r| r.qty.units())
            .sum()
    }

    proptest! {
        /// Goal: under any sequence of buyer actions, expiries and clock moves,
        /// the ledger stays balanced, its held/sold counters equal the units in
        /// HELD/SOLD reservations (so no unit is returned twice or lost), a
        /// key never yields two reservations, and no user holds two.
        #[test]
        fn random_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..200)) {
            let settings = SkuSettings::parse(Some(3), Some(5_000)).unwrap();
            let mut book = Book::new(Sku::parse("sku").unwrap(), settings);
            book.ledger.receive(10);
            let mut now = 1_000_000u64;
            let mut created = 0usize;
            for op in ops {
                let before = book.ledger;
                match op {
                    Op::Reserve { key: k, user, qty, ttl_s } => {
                        let user = UserId::parse(&format!("user-{user}")).unwrap();
                        let ttl = ttl_s.map(|s| TtlMs::parse(i64::from(s) * 1_000).unwrap());
                        let out = book.reserve(key(k), user.clone(), Qty::parse(qty.into(), 3).unwrap(), ttl, now);
                        match out {
                            ReserveOutcome::Held(r) => {
                                created += 1;
                                prop_assert_eq!(book.ledger.available + r.qty.units(), before.available);
                            }
                            ReserveOutcome::Replay(r) => {
                                prop_assert_eq!(r.user_id, user);
                                prop_assert_eq!(book.ledger, before);
                            }
                            _ => prop_assert_eq!(book.ledger, before),
                        }
                    }
                    Op::Confirm(k) => {
                        if let Some((v, r)) = book.confirm(&key(k), now) {
                            if v.result.is_ok() { prop_assert_eq!(r.status, Status::Sold); }
                        }
                    }
                    Op::Release(k) => {
                        if let Some((v, r)) = book.release(&key(k), now) {
                            if v.result.is_ok() {
                                prop_assert!(matches!(r.status, Status::Released | Status::Expired));
                            }
                        }
                    }
                    Op::Extend(k, s) => {
                        let _ = book.extend(&key(k), TtlMs::parse(i64::from(s) * 1_000).unwrap(), now);
                    }
                    Op::Expire => {
                        let back = book.expire_due(now);
                        prop_assert_eq!(book.ledger.available, before.available + back);
                        prop_assert_eq!(book.expire_due(now), 0, "a second expiry returns nothing");
                    }
                    Op::Advance(ms) => now += u64::from(ms),
                    Op::Receive(n) => book.ledger.receive(n.into()),
                }
                prop_assert!(book.ledger.is_balanced());
                prop_assert_eq!(book.ledger.held, units_in(&book, Status::Held));
                prop_assert_eq!(book.ledger.sold, units_in(&book, Status::Sold));
                prop_assert_eq!(book.reservations().count(), created);
                let mut users = std::collections::HashSet::new();
                for r in book.reservations().filter(|r| r.status.is_active()) {
                    prop_assert!(users.insert(r.user_id.clone()), "one active reservation per user");
                }
            }
        }
    }

    /// Goal: a confirm after expiry fails, and the units come back once.
    #[test]
    fn confirm_after_expiry_returns_units_once() {
        let mut book = Book::new(Sku::parse("s").unwrap(), SkuSettings::default());
        book.ledger.receive(1);
        let k = key(1);
        let out = book.reserve(
            k.clone(),
            UserId::parse("u").unwrap(),
            Qty::ONE,
            Some(TtlMs::parse(1_000).unwrap()),
            0,
        );
        assert!(matches!(out, ReserveOutcome::Held(_)));
        assert_eq!(book.ledger.available, 0);
        let (v, r) = book.confirm(&k, 1_000).unwrap();
        assert!(v.result.is_err());
        assert_eq!(r.status, Status::Expired);
        assert_eq!(book.ledger.available, 1);
        assert_eq!(book.expire_due(2_000), 0);
        assert_eq!(book.release(&k, 2_000).unwrap().0.change, None);
        assert_eq!(book.ledger.available, 1);
    }
}
