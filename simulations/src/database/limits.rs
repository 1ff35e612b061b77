//! The per-user limit across regions in the agent's database, in memory:
//! what `region-agent/src/store/limits.rs` keeps in SQL. As a borrower,
//! the places this region borrowed (its `borrows` table: asked, used by a
//! hold, or to give back); as a home, the places it lent (reservation rows
//! `LENT`, which the one-active-per-user index judges together with holds).
//!
//! The index is the decision, here as there: a place is lent only when its
//! user holds, has bought and has lent nothing here, and a user whose place
//! is lent cannot hold here until it is back.

use std::collections::{BTreeMap, HashMap};

use escrow_core::batch::{Batch, BatchOutcome};
use escrow_core::protocol::Borrow;
use escrow_core::{RequestKey, Status, TransferId, UserId};

use super::Database;

/// A borrow's state in the borrowing region's database (not the
/// coordinator's `BorrowState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BorrowerState {
    /// Asked of the home; no hold uses it yet.
    Asked,
    /// A hold uses it: it goes home when that hold ends unsold.
    Used,
    /// No hold will use it: it goes home.
    Return,
}

/// A place this region borrowed for the hold of `key`.
#[derive(Debug, Clone)]
pub struct BorrowRow {
    /// The borrow as asked.
    pub borrow: Borrow,
    /// The key of the hold it is for.
    pub key: RequestKey,
    /// Where it stands.
    pub state: BorrowerState,
}

/// A place this region lent as its user's home: out (`LENT`) or back
/// (`RETURNED`, which refuses a late ask under the same id).
#[derive(Debug, Clone)]
struct Loan {
    user: UserId,
    out: bool,
}

/// Borrowed and lent places.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Places borrowed, by id, until the coordinator says they are home.
    pub borrows: BTreeMap<TransferId, BorrowRow>,
    loans: BTreeMap<TransferId, Loan>,
    /// Users whose place is lent, with the loan.
    lent_to: HashMap<UserId, TransferId>,
}

impl Database {
    /// Records `borrow`, for the hold of `key`, as asked.
    pub fn ask_borrow(&mut self, borrow: Borrow, key: RequestKey) {
        self.writes += 1;
        let row = BorrowRow {
            borrow,
            key,
            state: BorrowerState::Asked,
        };
        let known = self.limits.borrows.insert(row.borrow.id.clone(), row);
        assert!(known.is_none(), "a borrow id is never reused");
    }

    /// Gives back borrow `id` if no hold used it.
    pub fn give_back(&mut self, id: &TransferId) {
        self.writes += 1;
        if let Some(row) = self.limits.borrows.get_mut(id) {
            if row.state == BorrowerState::Asked {
                row.state = BorrowerState::Return;
            }
        }
    }

    /// Gives back every borrow still asked: at a restart, when no request
    /// of the process before waits for one any more.
    pub fn give_back_unused(&mut self) {
        self.writes += 1;
        for row in self.limits.borrows.values_mut() {
            if row.state == BorrowerState::Asked {
                row.state = BorrowerState::Return;
            }
        }
    }

    /// Forgets borrows that are home (or were never lent).
    pub fn forget_borrows(&mut self, ids: &[TransferId]) {
        for id in ids {
            self.limits.borrows.remove(id);
        }
    }

    /// The borrows asked and not yet used: every sync carries them.
    pub fn borrow_asks(&self) -> Vec<Borrow> {
        self.borrows_where(|row| row.state == BorrowerState::Asked)
    }

    /// The borrows to give back: those no hold will use, and those whose
    /// hold ended unsold (the hold's own status says so; nothing writes
    /// it on the hot path).
    pub fn borrow_returns(&self) -> Vec<Borrow> {
        self.borrows_where(|row| match row.state {
            BorrowerState::Asked => false,
            BorrowerState::Return => true,
            BorrowerState::Used => self
                .book
                .get(&row.key)
                .is_none_or(|r| matches!(r.status, Status::Released | Status::Expired)),
        })
    }

    fn borrows_where(&self, keep: impl Fn(&BorrowRow) -> bool) -> Vec<Borrow> {
        self.limits
            .borrows
            .values()
            .filter(|row| keep(row))
            .map(|row| row.borrow.clone())
            .collect()
    }

    /// As the user's home: lends the place `ask` asks for if its user
    /// holds, has bought and has lent nothing here, and says whether the
    /// place is lent. Asked again, a loan is answered as it stands: lent
    /// while out, refused once back.
    pub fn lend(&mut self, ask: &Borrow) -> bool {
        self.writes += 1;
        if let Some(loan) = self.limits.loans.get(&ask.id) {
            return loan.out;
        }
        if self.limits.lent_to.contains_key(&ask.user_id) || self.holds_for(&ask.user_id) {
            return false;
        }
        let loan = Loan {
            user: ask.user_id.clone(),
            out: true,
        };
        self.limits.loans.insert(ask.id.clone(), loan);
        self.limits
            .lent_to
            .insert(ask.user_id.clone(), ask.id.clone());
        true
    }

    /// As the user's home: takes the place of `loan` back. A loan never
    /// made is recorded as back, so an ask that arrives after its return
    /// is refused.
    pub fn take_back(&mut self, loan: &Borrow) {
        self.writes += 1;
        let back = Loan {
            user: loan.user_id.clone(),
            out: false,
        };
        if let Some(was) = self.limits.loans.insert(loan.id.clone(), back) {
            if was.out {
                self.limits.lent_to.remove(&was.user);
            }
        }
    }

    /// Whether this region, as `user`'s home, has lent their place.
    pub fn has_lent(&self, user: &UserId) -> bool {
        self.limits.lent_to.contains_key(user)
    }

    /// Whether `user` holds or has bought here.
    fn holds_for(&self, user: &UserId) -> bool {
        self.book
            .reservations()
            .any(|r| r.user_id == *user && r.status.is_active())
    }

    /// Commits `batch`'s holds where the index lets them in: a hold of a
    /// user whose place is lent is not inserted, as the `LENT` row's
    /// unique index refuses it. The rest is the book's.
    pub(super) fn commit_book(&mut self, batch: &Batch) -> Result<BatchOutcome, String> {
        let lent: Vec<bool> = batch
            .holds
            .iter()
            .map(|h| self.limits.lent_to.contains_key(&h.user_id))
            .collect();
        if !lent.contains(&true) {
            return self.book.commit(batch);
        }
        let mut open = batch.clone();
        open.holds = batch
            .holds
            .iter()
            .zip(&lent)
            .filter(|(_, lent)| !**lent)
            .map(|(h, _)| h.clone())
            .collect();
        let mut outcome = self.book.commit(&open)?;
        let mut inserted = outcome.inserted.into_iter();
        outcome.inserted = lent
            .iter()
            .map(|lent| !lent && inserted.next().unwrap_or(false))
            .collect();
        Ok(outcome)
    }

    /// Marks the borrows of `batch`'s inserted holds used, in the holds'
    /// commit; each must still be asked.
    pub(super) fn mark_used(
        &mut self,
        batch: &Batch,
        outcome: &BatchOutcome,
    ) -> Result<(), String> {
        let used = batch
            .holds
            .iter()
            .zip(&outcome.inserted)
            .filter(|(_, inserted)| **inserted)
            .filter_map(|(h, _)| h.borrow.as_ref());
        for id in used {
            match self.limits.borrows.get_mut(id) {
                Some(row) if row.state == BorrowerState::Asked => row.state = BorrowerState::Used,
                _ => return Err(format!("borrow {id} of a hold was no longer asked")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use escrow_core::batch::NewHold;
    use escrow_core::{Book, Mode, Qty, RegionName, Sku, SkuSettings, Tenant};

    use super::*;

    fn database() -> Database {
        let tenant = Tenant::parse("t").unwrap();
        let mut db = Database::new(
            tenant,
            Book::new(Sku::parse("sku").unwrap(), SkuSettings::default()),
            Mode::Escrow,
        );
        db.book.ledger.receive(10);
        db
    }

    fn user(id: &str) -> UserId {
        UserId::parse(id).unwrap()
    }

    fn ask(id: &str, user_id: &str) -> Borrow {
        Borrow {
            id: TransferId::parse(id).unwrap(),
            tenant: Tenant::parse("t").unwrap(),
            sku: Sku::parse("sku").unwrap(),
            user_id: user(user_id),
            home: RegionName::parse("eu").unwrap(),
        }
    }

    /// Commits one hold of `user` under `key`, on `borrow` if given; whether it was inserted.
    fn hold(db: &mut Database, key: &str, user_id: &str, borrow: Option<&str>) -> bool {
        let mut batch = Batch::new(db.tenant.clone(), db.book.sku.clone(), 1);
        batch.holds.push(NewHold {
            request_key: RequestKey::parse(key).unwrap(),
            user_id: user(user_id),
            qty: Qty::parse(1, 1).unwrap(),
            expires_at_ms: 1_000,
            borrow: borrow.map(|id| TransferId::parse(id).unwrap()),
        });
        db.commit(&batch).inserted[0]
    }

    /// Goal: as a home, the one-active-per-user index decides: a user who
    /// holds here is not lent their place, a user whose place is lent
    /// cannot hold here until it is back, a loan asked again is answered
    /// as it stands, and a loan back is never lent again under its id.
    #[test]
    fn the_index_judges_loans_and_holds_together() {
        let mut db = database();
        assert!(hold(&mut db, "k1", "held", None));
        assert!(!db.lend(&ask("b-1", "held")), "holds here: refused");
        assert!(db.lend(&ask("b-2", "away")));
        assert!(db.lend(&ask("b-2", "away")), "asked again: still lent");
        assert!(db.has_lent(&user("away")));
        assert!(!db.lend(&ask("b-3", "away")), "lent already: refused");
        assert!(!hold(&mut db, "k2", "away", None), "lent: no hold here");
        db.take_back(&ask("b-2", "away"));
        assert!(!db.has_lent(&user("away")));
        assert!(!db.lend(&ask("b-2", "away")), "back: the id is spent");
        assert!(hold(&mut db, "k3", "away", None), "back: holds again");
        db.take_back(&ask("b-4", "late"));
        assert!(!db.lend(&ask("b-4", "late")), "returned before asked");
        assert_eq!(db.book.ledger.held, 2);
    }

    /// Goal: as a borrower, a borrow goes home unless a hold uses it, and
    /// a used one goes home once its hold ends unsold; a restart gives
    /// back every borrow still asked.
    #[test]
    fn borrows_go_home_unless_held() {
        let mut db = database();
        db.ask_borrow(ask("b-1", "a"), RequestKey::parse("k1").unwrap());
        db.ask_borrow(ask("b-2", "b"), RequestKey::parse("k2").unwrap());
        db.ask_borrow(ask("b-3", "c"), RequestKey::parse("k3").unwrap());
        assert_eq!(db.borrow_asks().len(), 3);
        assert!(hold(&mut db, "k1", "a", Some("b-1")));
        db.give_back(&TransferId::parse("b-1").unwrap());
        db.give_back(&TransferId::parse("b-2").unwrap());
        let ids = |v: Vec<Borrow>| v.into_iter().map(|b| b.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(db.borrow_returns()), ["b-2"], "a used borrow stays");
        db.give_back_unused();
        assert_eq!(ids(db.borrow_returns()), ["b-2", "b-3"]);
        assert!(db.borrow_asks().is_empty());
        let mut batch = Batch::new(db.tenant.clone(), db.book.sku.clone(), 2);
        let key = RequestKey::parse("k1").unwrap();
        let qty = Qty::parse(1, 1).unwrap();
        batch
            .transitions
            .push((key, qty, escrow_core::Transition::Release));
        db.commit(&batch);
        assert_eq!(ids(db.borrow_returns()), ["b-1", "b-2", "b-3"]);
        db.forget_borrows(&[TransferId::parse("b-1").unwrap()]);
        assert_eq!(ids(db.borrow_returns()), ["b-2", "b-3"]);
    }
}
