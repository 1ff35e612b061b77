//! The coordinator's relay of borrowed places under a global per-user
//! limit, in memory: what `coordinator/src/store/limits.rs` keeps in its
//! `borrows` table and does with a region's [`LimitsUp`] (docs/protocol.md,
//! "Per-user limit across regions").
//!
//! Each borrow moves only forward, by escrow-core's [`BorrowState`] moves
//! (ASKED -> LENT | REFUSED -> RETURNING -> RETURNED), so a repeated, late
//! or reordered message never lends a place twice or strands one. What the
//! home and the borrower must hear rides on their watch answers at once,
//! half a round trip ahead of their syncs.

use std::collections::BTreeMap;

use escrow_core::protocol::{Borrow, LendAnswer, LimitsDown, LimitsUp};
use escrow_core::user_limit::{home_region, BorrowState};
use escrow_core::{RegionName, TransferId, UserLimitScope};

use super::Coordinator;

/// One borrow as the coordinator stores it.
#[derive(Debug, Clone)]
struct Row {
    borrow: Borrow,
    /// The borrowing region's index.
    borrower: usize,
    state: BorrowState,
}

/// Every borrow the coordinator has heard of, by id (ids are never
/// reused, so rows are kept for good, as the real table keeps them).
#[derive(Debug, Default)]
pub(super) struct Borrows {
    rows: BTreeMap<TransferId, Row>,
}

/// Which end of a borrow a region speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Borrower,
    Home,
}

impl Coordinator {
    /// Applies what region `r` says of its borrows and loans (from a sync
    /// or a limits call), and answers: the home's answers to its asks,
    /// its returns that are complete, and every loan asked of it or asked
    /// back as a home. The other regions concerned have their watch
    /// answered with what they must hear.
    pub fn relay_limits(&mut self, r: usize, up: &LimitsUp) -> LimitsDown {
        let here = self.names[r].clone();
        // Who to wake, with what their watch answer carries.
        let mut wake: Vec<(usize, LimitsDown)> = Vec::new();
        // A region never borrows from itself: such an ask (or return) is
        // no borrow at all, and is answered nothing.
        for ask in up.asks.iter().filter(|a| a.home != here) {
            let valid = self.names_the_home(r, ask);
            if self.insert(r, ask, BorrowState::asked(valid)) && valid {
                let carry = LimitsDown {
                    lend_asks: vec![ask.clone()],
                    ..LimitsDown::default()
                };
                wake.push((self.index_of(&ask.home), carry));
            }
        }
        for ret in up.returns.iter().filter(|b| b.home != here) {
            self.insert(r, ret, BorrowState::Returned);
            let Some((state, row)) = self.state_of(&ret.id, Side::Borrower, r) else {
                continue;
            };
            if let Some(next) = state.on_return() {
                self.advance(&ret.id, next);
                if next == BorrowState::Returning {
                    let carry = LimitsDown {
                        lend_returns: vec![ret.clone()],
                        ..LimitsDown::default()
                    };
                    wake.push((self.index_of(&row.borrow.home), carry));
                }
            }
        }
        for answer in &up.answers {
            let Some((state, row)) = self.state_of(&answer.id, Side::Home, r) else {
                continue;
            };
            if let Some(next) = state.on_answer(answer.lent) {
                self.advance(&answer.id, next);
                wake.push((row.borrower, next.borrower_news(&answer.id)));
            }
        }
        for id in &up.returned {
            let Some((state, row)) = self.state_of(id, Side::Home, r) else {
                continue;
            };
            if let Some(next) = state.on_taken_back() {
                self.advance(id, next);
                wake.push((row.borrower, LimitsDown::default()));
            }
        }
        let mut down = LimitsDown::default();
        for ask in &up.asks {
            let answer = self.state_of(&ask.id, Side::Borrower, r);
            if let Some(lent) = answer.and_then(|(state, _)| state.answer()) {
                down.answers.push(LendAnswer {
                    id: ask.id.clone(),
                    lent,
                });
            }
        }
        for ret in &up.returns {
            let state = self.state_of(&ret.id, Side::Borrower, r);
            if state.is_some_and(|(state, _)| state == BorrowState::Returned) {
                down.returned.push(ret.id.clone());
            }
        }
        down.lend_asks = self.for_home(r, BorrowState::Asked);
        down.lend_returns = self.for_home(r, BorrowState::Returning);
        for (other, carry) in wake.into_iter().filter(|(other, _)| *other != r) {
            let kept = &mut self.carry[other];
            kept.answers.extend(carry.answers);
            kept.lend_asks.extend(carry.lend_asks);
            kept.lend_returns.extend(carry.lend_returns);
            self.notice(other);
        }
        down
    }

    /// Whether `ask`, from region `r`, names the user's true home: the
    /// SKU's, its scope is global, and the home rule picks `ask.home`
    /// among its regions, which is not `r`.
    fn names_the_home(&self, r: usize, ask: &Borrow) -> bool {
        ask.tenant == self.allocation.tenant
            && ask.sku == self.allocation.sku
            && self.allocation.settings.user_limit_scope == UserLimitScope::Global
            && home_region(&ask.user_id, &self.names) == Some(&ask.home)
            && ask.home != self.names[r]
    }

    /// The index of a region that takes part (an ask naming another is
    /// refused before it is relayed).
    fn index_of(&self, region: &RegionName) -> usize {
        self.names
            .iter()
            .position(|n| n == region)
            .expect("only borrows naming a region of the SKU are relayed")
    }

    /// Records `borrow`, asked or returned by region `r`, in `state`,
    /// unless its id is known; whether it was new.
    fn insert(&mut self, r: usize, borrow: &Borrow, state: BorrowState) -> bool {
        if self.borrows.rows.contains_key(&borrow.id) {
            return false;
        }
        let row = Row {
            borrow: borrow.clone(),
            borrower: r,
            state,
        };
        self.borrows.rows.insert(borrow.id.clone(), row);
        true
    }

    /// The state of borrow `id` with its row, if region `r` is its `side`.
    fn state_of(&self, id: &TransferId, side: Side, r: usize) -> Option<(BorrowState, Row)> {
        let row = self.borrows.rows.get(id)?;
        let ours = match side {
            Side::Borrower => row.borrower == r,
            Side::Home => row.borrow.home == self.names[r],
        };
        ours.then(|| (row.state, row.clone()))
    }

    /// Moves borrow `id` to `to`, a move escrow-core's rules allowed from
    /// the state just read.
    fn advance(&mut self, id: &TransferId, to: BorrowState) {
        let row = self
            .borrows
            .rows
            .get_mut(id)
            .expect("a borrow is advanced right after it is read");
        row.state = to;
    }

    /// The borrows whose home is region `r`, in `state`, in id order.
    fn for_home(&self, r: usize, state: BorrowState) -> Vec<Borrow> {
        self.borrows
            .rows
            .values()
            .filter(|row| row.state == state && row.borrow.home == self.names[r])
            .map(|row| row.borrow.clone())
            .collect()
    }

    /// Borrows the coordinator has not settled: asked and not answered,
    /// or given back and not yet home.
    pub fn borrows_unsettled(&self) -> usize {
        self.borrows
            .rows
            .values()
            .filter(|row| matches!(row.state, BorrowState::Asked | BorrowState::Returning))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use escrow_core::{Sku, Tenant, UserId};

    use super::*;
    use crate::coordinator::SkuIdentity;
    use crate::policies;
    use crate::scenario::PolicySettings;

    const EU: usize = 0;
    const US: usize = 1;
    const AP: usize = 2;

    fn coordinator() -> Coordinator {
        let policy = policies::build("static", &PolicySettings::default(), 200).unwrap();
        let regions = ["eu", "us", "ap"]
            .map(|r| RegionName::parse(r).unwrap())
            .to_vec();
        let id = SkuIdentity {
            tenant: Tenant::parse("sim").unwrap(),
            sku: Sku::parse("sku").unwrap(),
            max_per_user: 1,
            hold_ttl_ms: 600_000,
            user_limit_scope: UserLimitScope::Global,
            regions,
        };
        Coordinator::new(30, vec![1, 1, 1], policy, 250, id)
    }

    fn borrow(id: &str, user: &str, home: &str) -> Borrow {
        Borrow {
            id: TransferId::parse(id).unwrap(),
            tenant: Tenant::parse("sim").unwrap(),
            sku: Sku::parse("sku").unwrap(),
            user_id: UserId::parse(user).unwrap(),
            home: RegionName::parse(home).unwrap(),
        }
    }

    fn asks(b: &Borrow) -> LimitsUp {
        LimitsUp {
            asks: vec![b.clone()],
            ..LimitsUp::default()
        }
    }

    fn returns(b: &Borrow) -> LimitsUp {
        LimitsUp {
            returns: vec![b.clone()],
            ..LimitsUp::default()
        }
    }

    /// Goal: a borrow's whole life through the relay, each step waking the
    /// one region that must hear it: the ask reaches the home, the answer
    /// the borrower, the return the home, and the home's taking back the
    /// borrower. Repeated and late messages wake nobody and lend nothing;
    /// an ask naming another home than the user's is refused unrelayed.
    #[test]
    fn a_borrow_goes_out_and_comes_home_once() {
        let mut c = coordinator();
        let b = borrow("b-eu-1-0", "us:7", "us");
        assert!(c.relay_limits(EU, &asks(&b)).answers.is_empty());
        assert_eq!(c.take_notices(), [US]);
        let news = c.watch_news(US, 1);
        assert_eq!(news.limits.lend_asks, std::slice::from_ref(&b));
        assert!(news.skus.is_empty(), "borrows only: no SKU news");
        c.relay_limits(EU, &asks(&b));
        assert!(c.take_notices().is_empty(), "a repeated ask is no news");
        assert_eq!(
            c.relay_limits(US, &LimitsUp::default()).lend_asks,
            std::slice::from_ref(&b)
        );

        let lent = LendAnswer {
            id: b.id.clone(),
            lent: true,
        };
        let answers = LimitsUp {
            answers: vec![lent.clone()],
            ..LimitsUp::default()
        };
        assert!(c.relay_limits(US, &answers).lend_asks.is_empty());
        assert_eq!(c.take_notices(), [EU]);
        assert_eq!(
            c.watch_news(EU, 1).limits.answers,
            std::slice::from_ref(&lent)
        );
        c.relay_limits(US, &answers);
        assert!(c.take_notices().is_empty(), "a repeated answer is no news");
        assert_eq!(c.relay_limits(EU, &asks(&b)).answers, [lent]);

        let wrong = borrow("b-eu-1-1", "us:8", "ap");
        let refused = LendAnswer {
            id: wrong.id.clone(),
            lent: false,
        };
        assert_eq!(c.relay_limits(EU, &asks(&wrong)).answers, [refused]);
        assert!(c.take_notices().is_empty(), "never relayed to ap");
        assert!(c
            .relay_limits(AP, &LimitsUp::default())
            .lend_asks
            .is_empty());

        assert!(c.relay_limits(EU, &returns(&b)).returned.is_empty());
        assert_eq!(c.take_notices(), [US]);
        assert_eq!(
            c.watch_news(US, 1).limits.lend_returns,
            std::slice::from_ref(&b)
        );
        assert_eq!(c.borrows_unsettled(), 1);
        let back = LimitsUp {
            returned: vec![b.id.clone()],
            ..LimitsUp::default()
        };
        c.relay_limits(US, &back);
        assert_eq!(c.take_notices(), [EU]);
        assert_eq!(
            c.relay_limits(EU, &returns(&b)).returned,
            std::slice::from_ref(&b.id)
        );
        assert!(c.relay_limits(EU, &asks(&b)).answers.is_empty());
        assert!(c.take_notices().is_empty(), "a late ask is never relayed");
        assert_eq!(c.relay_limits(EU, &returns(&wrong)).returned, [wrong.id]);
        assert_eq!(c.borrows_unsettled(), 0);
    }
}
