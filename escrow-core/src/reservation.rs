//! The reservation lifecycle: HELD -> SOLD | RELEASED | EXPIRED.
//!
//! Each buyer action is a function of the reservation and `now` that returns
//! a [`Verdict`]: the state change to make (if any) and whether the action
//! succeeded. Drivers carry the change out with a conditional statement whose
//! precondition is the same as here (`WHERE status = 'HELD' AND expires_at > now`),
//! so the database judges races and this code decides the answer.
//!
//! A hold past `expires_at` is never confirmable: any action that finds it
//! expires it first, so its units return exactly once, whoever notices first.

use serde::Serialize;

use crate::ids::{Qty, RequestKey, Sku, TtlMs, UserId};
use crate::ledger::{Ledger, LedgerError};

/// Where a reservation is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Units are set aside for the buyer until `expires_at`.
    Held,
    /// The buyer confirmed; the units are gone for good.
    Sold,
    /// The buyer let go; the units went back to available.
    Released,
    /// The hold timed out; the units went back to available.
    Expired,
}

impl Status {
    /// The status as stored and shown (`HELD`, `SOLD`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Held => "HELD",
            Status::Sold => "SOLD",
            Status::Released => "RELEASED",
            Status::Expired => "EXPIRED",
        }
    }

    /// Parses a stored status.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "HELD" => Some(Status::Held),
            "SOLD" => Some(Status::Sold),
            "RELEASED" => Some(Status::Released),
            "EXPIRED" => Some(Status::Expired),
            _ => None,
        }
    }

    /// HELD and SOLD reservations count against the one-per-user limit.
    pub fn is_active(self) -> bool {
        matches!(self, Status::Held | Status::Sold)
    }
}

/// One buyer's reservation of units of one SKU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reservation {
    /// The idempotency key that created it.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// The SKU reserved.
    pub sku: Sku,
    /// Units reserved.
    pub qty: Qty,
    /// Current lifecycle state.
    pub status: Status,
    /// When a HELD reservation stops being confirmable, ms since the epoch.
    pub expires_at_ms: u64,
    /// Whether the single allowed extension was used.
    pub extended: bool,
}

/// A state change a driver must carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// HELD -> SOLD: units move from held to sold.
    Confirm,
    /// HELD -> RELEASED: units move from held back to available.
    Release,
    /// HELD -> EXPIRED: units move from held back to available.
    Expire,
    /// HELD stays HELD with a later expiry; no units move.
    Extend {
        /// The new expiry, ms since the epoch.
        expires_at_ms: u64,
    },
}

impl Transition {
    /// The status a reservation has after this transition.
    pub fn target(self) -> Status {
        match self {
            Transition::Confirm => Status::Sold,
            Transition::Release => Status::Released,
            Transition::Expire => Status::Expired,
            Transition::Extend { .. } => Status::Held,
        }
    }

    /// Moves the reservation's units in the region's ledger.
    pub fn apply_to_ledger(self, ledger: &mut Ledger, qty: Qty) -> Result<(), LedgerError> {
        match self {
            Transition::Confirm => ledger.sell(qty.units()),
            Transition::Release | Transition::Expire => ledger.unhold(qty.units()),
            Transition::Extend { .. } => Ok(()),
        }
    }
}

/// Why an action did not do what the buyer asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The reservation is not HELD (or its hold ran out).
    NotHeld,
    /// The reservation was already extended once.
    AlreadyExtended,
    /// The reservation is SOLD; it cannot be released.
    AlreadySold,
}

/// The outcome of a buyer action on a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The change to make, if any.
    pub change: Option<Transition>,
    /// `Ok` when the action succeeded (HTTP 200), else why not (HTTP 409).
    pub result: Result<(), Refusal>,
}

impl Verdict {
    fn ok(change: Option<Transition>) -> Self {
        Self {
            change,
            result: Ok(()),
        }
    }

    fn refused(change: Option<Transition>, why: Refusal) -> Self {
        Self {
            change,
            result: Err(why),
        }
    }
}

/// Where a hold stands in its lifecycle, all the rules of HELD -> SOLD |
/// RELEASED | EXPIRED need: a reservation's, and a cart's (whose items
/// share one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// Current lifecycle state.
    pub status: Status,
    /// When a HELD hold stops being confirmable, ms since the epoch.
    pub expires_at_ms: u64,
    /// Whether the single allowed extension was used.
    pub extended: bool,
}

impl Lifecycle {
    /// Whether a HELD reservation's time is up at `now_ms`.
    pub fn is_due(&self, now_ms: u64) -> bool {
        self.status == Status::Held && now_ms >= self.expires_at_ms
    }

    /// Expire a due hold, else nothing: the background expiry.
    pub fn expire(&self, now_ms: u64) -> Verdict {
        if self.is_due(now_ms) {
            Verdict::ok(Some(Transition::Expire))
        } else {
            Verdict::refused(None, Refusal::NotHeld)
        }
    }

    /// HELD -> SOLD while unexpired; SOLD again is a success without change.
    pub fn confirm(&self, now_ms: u64) -> Verdict {
        match self.status {
            Status::Held if self.is_due(now_ms) => {
                Verdict::refused(Some(Transition::Expire), Refusal::NotHeld)
            }
            Status::Held => Verdict::ok(Some(Transition::Confirm)),
            Status::Sold => Verdict::ok(None),
            Status::Released | Status::Expired => Verdict::refused(None, Refusal::NotHeld),
        }
    }

    /// HELD -> RELEASED (or EXPIRED if its time was up); repeating it changes nothing.
    pub fn release(&self, now_ms: u64) -> Verdict {
        match self.status {
            Status::Held if self.is_due(now_ms) => Verdict::ok(Some(Transition::Expire)),
            Status::Held => Verdict::ok(Some(Transition::Release)),
            Status::Released | Status::Expired => Verdict::ok(None),
            Status::Sold => Verdict::refused(None, Refusal::AlreadySold),
        }
    }

    /// Moves the expiry to `now + ttl` (never earlier than it was), once per
    /// hold, while HELD and unexpired.
    pub fn extend(&self, now_ms: u64, ttl: TtlMs) -> Verdict {
        match self.status {
            Status::Held if self.is_due(now_ms) => {
                Verdict::refused(Some(Transition::Expire), Refusal::NotHeld)
            }
            Status::Held if self.extended => Verdict::refused(None, Refusal::AlreadyExtended),
            Status::Held => Verdict::ok(Some(Transition::Extend {
                expires_at_ms: self.expires_at_ms.max(now_ms + ttl.get()),
            })),
            Status::Sold | Status::Released | Status::Expired => {
                Verdict::refused(None, Refusal::NotHeld)
            }
        }
    }

    /// Records a transition decided by one of the methods above.
    pub fn apply(&mut self, change: Transition) {
        assert_eq!(self.status, Status::Held, "only a HELD reservation changes");
        self.status = change.target();
        if let Transition::Extend { expires_at_ms } = change {
            self.expires_at_ms = expires_at_ms;
            self.extended = true;
        }
    }
}

impl Reservation {
    /// Its place in the lifecycle.
    pub fn lifecycle(&self) -> Lifecycle {
        Lifecycle {
            status: self.status,
            expires_at_ms: self.expires_at_ms,
            extended: self.extended,
        }
    }

    /// Whether a HELD reservation's time is up at `now_ms`.
    pub fn is_due(&self, now_ms: u64) -> bool {
        self.lifecycle().is_due(now_ms)
    }

    /// See [`Lifecycle::expire`].
    pub fn expire(&self, now_ms: u64) -> Verdict {
        self.lifecycle().expire(now_ms)
    }

    /// See [`Lifecycle::confirm`].
    pub fn confirm(&self, now_ms: u64) -> Verdict {
        self.lifecycle().confirm(now_ms)
    }

    /// See [`Lifecycle::release`].
    pub fn release(&self, now_ms: u64) -> Verdict {
        self.lifecycle().release(now_ms)
    }

    /// See [`Lifecycle::extend`].
    pub fn extend(&self, now_ms: u64, ttl: TtlMs) -> Verdict {
        self.lifecycle().extend(now_ms, ttl)
    }

    /// Records a transition decided by one of the methods above.
    pub fn apply(&mut self, change: Transition) {
        let mut lifecycle = self.lifecycle();
        lifecycle.apply(change);
        self.status = lifecycle.status;
        self.expires_at_ms = lifecycle.expires_at_ms;
        self.extended = lifecycle.extended;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(expires_at_ms: u64) -> Reservation {
        Reservation {
            request_key: RequestKey::parse("k").unwrap(),
            user_id: UserId::parse("u").unwrap(),
            sku: Sku::parse("s").unwrap(),
            qty: Qty::ONE,
            status: Status::Held,
            expires_at_ms,
            extended: false,
        }
    }

    /// Goal: an expired hold is never confirmable, and any action on it expires it.
    #[test]
    fn an_expired_hold_is_never_confirmable() {
        let r = held(1_000);
        assert_eq!(r.confirm(999), Verdict::ok(Some(Transition::Confirm)));
        assert_eq!(
            r.confirm(1_000),
            Verdict::refused(Some(Transition::Expire), Refusal::NotHeld)
        );
        assert_eq!(r.release(1_000), Verdict::ok(Some(Transition::Expire)));
        assert_eq!(
            r.extend(1_000, TtlMs::parse(5_000).unwrap()),
            Verdict::refused(Some(Transition::Expire), Refusal::NotHeld)
        );
    }

    /// Goal: repeated actions are answered without moving units twice.
    #[test]
    fn repeated_actions_change_nothing() {
        let mut r = held(1_000);
        r.apply(Transition::Release);
        assert_eq!(r.release(0), Verdict::ok(None));
        assert_eq!(r.confirm(0), Verdict::refused(None, Refusal::NotHeld));
        assert_eq!(r.expire(5_000), Verdict::refused(None, Refusal::NotHeld));
        let mut s = held(1_000);
        s.apply(Transition::Confirm);
        assert_eq!(s.confirm(0), Verdict::ok(None));
        assert_eq!(s.release(0), Verdict::refused(None, Refusal::AlreadySold));
    }

    /// Goal: a hold extends once, to now + ttl.
    #[test]
    fn a_hold_extends_once() {
        let mut r = held(1_000);
        let ttl = TtlMs::parse(2_000).unwrap();
        let v = r.extend(500, ttl);
        assert_eq!(
            v,
            Verdict::ok(Some(Transition::Extend {
                expires_at_ms: 2_500
            }))
        );
        r.apply(Transition::Extend {
            expires_at_ms: 2_500,
        });
        assert_eq!(
            r.extend(600, ttl),
            Verdict::refused(None, Refusal::AlreadyExtended)
        );
    }
}
