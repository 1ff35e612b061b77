//! What each answer means, and counts of them.
//!
//! The load generator classifies every response by status code and, where
//! the status alone is ambiguous (409, 503), by the contract's outcome name
//! in the body. Counting outcomes rather than status codes is what lets the
//! benchmark and its smoke test check correctness: exactly `stock` holds,
//! everything else SOLD_OUT, nothing lost.

use std::fmt;
use std::ops::{Index, IndexMut};

use hyper::StatusCode;

/// The outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// 201: a new hold.
    Held,
    /// 200 to a reserve: the key's existing reservation.
    Replay,
    /// 409 SOLD_OUT.
    SoldOut,
    /// 409 USER_LIMIT.
    UserLimit,
    /// 422 KEY_REUSED.
    KeyReused,
    /// 404 to a reserve: the SKU does not exist.
    UnknownSku,
    /// 200 to a confirm.
    Confirmed,
    /// 200 to a release.
    Released,
    /// 409 to a confirm or release: the hold was no longer HELD.
    Refused,
    /// 404 to a confirm or release.
    NotFound,
    /// 503 PAUSED.
    Paused,
    /// 503 REJECTED_QUEUE_FULL.
    QueueFull,
    /// 503 REJECTED_WAIT_TIMEOUT.
    WaitTimeout,
    /// 400.
    BadRequest,
    /// 401.
    Unauthorized,
    /// Any other 5xx.
    ServerError,
    /// Any other status.
    Unexpected,
    /// The connection failed; no answer.
    Transport,
}

impl Outcome {
    /// Every outcome, in report order.
    pub const ALL: [Outcome; 18] = [
        Outcome::Held,
        Outcome::Replay,
        Outcome::SoldOut,
        Outcome::UserLimit,
        Outcome::KeyReused,
        Outcome::UnknownSku,
        Outcome::Confirmed,
        Outcome::Released,
        Outcome::Refused,
        Outcome::NotFound,
        Outcome::Paused,
        Outcome::QueueFull,
        Outcome::WaitTimeout,
        Outcome::BadRequest,
        Outcome::Unauthorized,
        Outcome::ServerError,
        Outcome::Unexpected,
        Outcome::Transport,
    ];

    /// The contract's name (or a descriptive one where it has none).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Held => "HELD",
            Outcome::Replay => "REPLAY",
            Outcome::SoldOut => "SOLD_OUT",
            Outcome::UserLimit => "USER_LIMIT",
            Outcome::KeyReused => "KEY_REUSED",
            Outcome::UnknownSku => "UNKNOWN_SKU",
            Outcome::Confirmed => "CONFIRMED",
            Outcome::Released => "RELEASED",
            Outcome::Refused => "REFUSED",
            Outcome::NotFound => "NOT_FOUND",
            Outcome::Paused => "PAUSED",
            Outcome::QueueFull => "REJECTED_QUEUE_FULL",
            Outcome::WaitTimeout => "REJECTED_WAIT_TIMEOUT",
            Outcome::BadRequest => "BAD_REQUEST",
            Outcome::Unauthorized => "UNAUTHORIZED",
            Outcome::ServerError => "5xx",
            Outcome::Unexpected => "UNEXPECTED",
            Outcome::Transport => "TRANSPORT_ERROR",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The outcome of a reserve call.
    pub fn of_reserve(status: StatusCode, body: &[u8]) -> Outcome {
        match status.as_u16() {
            201 => Outcome::Held,
            200 => Outcome::Replay,
            409 if contains(body, b"SOLD_OUT") => Outcome::SoldOut,
            409 if contains(body, b"USER_LIMIT") => Outcome::UserLimit,
            422 => Outcome::KeyReused,
            404 => Outcome::UnknownSku,
            _ => Outcome::of_other(status, body),
        }
    }

    /// The outcome of a confirm (`confirm = true`) or release call.
    pub fn of_action(confirm: bool, status: StatusCode, body: &[u8]) -> Outcome {
        match status.as_u16() {
            200 if confirm => Outcome::Confirmed,
            200 => Outcome::Released,
            409 => Outcome::Refused,
            404 => Outcome::NotFound,
            _ => Outcome::of_other(status, body),
        }
    }

    fn of_other(status: StatusCode, body: &[u8]) -> Outcome {
        match status.as_u16() {
            503 if contains(body, b"QUEUE_FULL") => Outcome::QueueFull,
            503 if contains(body, b"WAIT_TIMEOUT") => Outcome::WaitTimeout,
            503 if contains(body, b"PAUSED") => Outcome::Paused,
            400 => Outcome::BadRequest,
            401 => Outcome::Unauthorized,
            500..=599 => Outcome::ServerError,
            _ => Outcome::Unexpected,
        }
    }

    /// Whether this is the answer a healthy server gives under load: a
    /// decision (held, sold out, confirmed, ...), not a failure or shedding.
    pub fn is_decision(self) -> bool {
        matches!(
            self,
            Outcome::Held
                | Outcome::Replay
                | Outcome::SoldOut
                | Outcome::UserLimit
                | Outcome::KeyReused
                | Outcome::Confirmed
                | Outcome::Released
                | Outcome::Refused
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Counts per outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally([u64; Outcome::ALL.len()]);

impl Tally {
    /// Counts one more `outcome`.
    pub fn add(&mut self, outcome: Outcome) {
        self[outcome] += 1;
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Tally) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
    }

    /// All requests counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Requests that did not end in a decision (shed, failed, unexpected).
    pub fn failures(&self) -> u64 {
        Outcome::ALL
            .iter()
            .filter(|o| !o.is_decision())
            .map(|&o| self[o])
            .sum()
    }
}

impl Index<Outcome> for Tally {
    type Output = u64;
    fn index(&self, outcome: Outcome) -> &u64 {
        &self.0[outcome.index()]
    }
}

impl IndexMut<Outcome> for Tally {
    fn index_mut(&mut self, outcome: Outcome) -> &mut u64 {
        &mut self.0[outcome.index()]
    }
}

/// `HELD=3 SOLD_OUT=7`: the non-zero counts.
impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for outcome in Outcome::ALL {
            let n = self[outcome];
            if n == 0 {
                continue;
            }
            if !first {
                f.write_str(" ")?;
            }
            write!(f, "{outcome}={n}")?;
            first = false;
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: 409 and 503 bodies are told apart by the contract's outcome names.
    #[test]
    fn classifies_by_status_and_outcome_name() {
        let c = StatusCode::CONFLICT;
        assert_eq!(
            Outcome::of_reserve(c, br#"{"outcome":"SOLD_OUT"}"#),
            Outcome::SoldOut
        );
        assert_eq!(
            Outcome::of_reserve(c, br#"{"outcome":"USER_LIMIT"}"#),
            Outcome::UserLimit
        );
        let u = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            Outcome::of_reserve(u, br#"{"outcome":"REJECTED_QUEUE_FULL"}"#),
            Outcome::QueueFull
        );
        assert_eq!(
            Outcome::of_reserve(
                u,
                br#"{"outcome":"PAUSED","reason":"coordinator_unreachable"}"#
            ),
            Outcome::Paused
        );
        assert_eq!(
            Outcome::of_action(true, StatusCode::OK, b"{}"),
            Outcome::Confirmed
        );
        assert_eq!(
            Outcome::of_action(false, StatusCode::OK, b"{}"),
            Outcome::Released
        );
        let mut t = Tally::default();
        t.add(Outcome::Held);
        t.add(Outcome::QueueFull);
        assert_eq!(t.total(), 2);
        assert_eq!(t.failures(), 1);
        assert_eq!(t.to_string(), "HELD=1 REJECTED_QUEUE_FULL=1");
    }
}
