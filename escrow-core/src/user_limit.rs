//! The per-user limit across regions: who judges a user's one active
//! reservation of a SKU.
//!
//! Under [`UserLimitScope::Region`] (the default) every region judges its
//! own rows: a user may hold one reservation of the SKU in each region.
//! Under [`UserLimitScope::Global`] a user holds at most one anywhere. Each
//! user then has a **home region**, found by a stable rule from the user id
//! and the SKU's regions alone ([`home_region`]), so every agent and the
//! coordinator agree on it without asking anyone:
//!
//! - a user id of the form `{region}:{rest}` whose prefix names one of the
//!   SKU's regions is at home there (a shop that routes each user to a
//!   region can say so in the id and pay no round trip);
//! - any other id is placed by rendezvous hashing over the SKU's regions
//!   (FNV-1a of region and id, mixed by MurmurHash3's finaliser; highest
//!   wins; fixed functions, so stable across releases).
//!
//! The home region judges its users' holds locally, as today. A user
//! buying elsewhere first **borrows** their place from the home region
//! (through the coordinator: [`crate::protocol::Borrow`]); the home stores
//! the loan as a reservation row with status `LENT`, which the same unique
//! index as a hold keeps to one per user. The loan comes back when the
//! remote hold ends unsold. docs/protocol.md, "Per-user limit across
//! regions", gives the whole exchange and its cost.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{IdError, RegionName, TransferId, UserId};
use crate::protocol::{LendAnswer, LimitsDown};

/// Whether a SKU's per-user limit counts each region's rows on their own or
/// all regions' together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum UserLimitScope {
    /// Each region judges its own rows (a user may hold in every region).
    #[default]
    Region,
    /// One active reservation per user across all regions.
    Global,
}

impl UserLimitScope {
    /// Parses `region` or `global`.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        match raw {
            "region" => Ok(Self::Region),
            "global" => Ok(Self::Global),
            _ => Err(IdError::Alphabet {
                field: "user_limit_scope",
                alphabet: "one of region, global",
            }),
        }
    }

    /// The scope as stored and shown: `region` or `global`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Region => "region",
            Self::Global => "global",
        }
    }
}

impl fmt::Display for UserLimitScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who judges a user's hold of a SKU in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judge {
    /// This region, from its own rows: the scope is `region`, or this is
    /// the user's home.
    Here,
    /// The user's home region, elsewhere: the hold needs a borrowed place.
    Home(RegionName),
    /// The scope is `global` but the SKU's regions are not known yet (an
    /// agent that has not heard from the coordinator since it started):
    /// nobody can judge, the request must wait or pause.
    Unknown,
}

/// Who judges `user`'s hold in `here`, for a SKU of `scope` sold in
/// `regions` (empty when not known).
pub fn judge(
    scope: UserLimitScope,
    user: &UserId,
    here: &RegionName,
    regions: &[RegionName],
) -> Judge {
    if scope == UserLimitScope::Region {
        return Judge::Here;
    }
    match home_region(user, regions) {
        None => Judge::Unknown,
        Some(home) if home == here => Judge::Here,
        Some(home) => Judge::Home(home.clone()),
    }
}

/// The home region of `user` among `regions`, or `None` if there are none:
/// the region the id's prefix up to its first `:` names, if it is one of
/// them; otherwise the one with the highest score of (region, user).
pub fn home_region<'a>(user: &UserId, regions: &'a [RegionName]) -> Option<&'a RegionName> {
    if let Some((prefix, _)) = user.as_str().split_once(':') {
        if let Some(named) = regions.iter().find(|r| r.as_str() == prefix) {
            return Some(named);
        }
    }
    regions
        .iter()
        .max_by_key(|r| (rendezvous(r, user), r.as_str()))
}

/// The score of `region` for `user`: FNV-1a of both, through MurmurHash3's
/// 64-bit finaliser, which spreads similar ids (`u1`, `u2`, ...) that
/// FNV-1a alone leaves close together, so the highest score would favour
/// one region.
fn rendezvous(region: &RegionName, user: &UserId) -> u64 {
    let mut h = fnv1a(&[
        region.as_str().as_bytes(),
        &[0xff],
        user.as_str().as_bytes(),
    ]);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Where a borrowed place stands at the coordinator, which relays it
/// between the borrowing region and the user's home. States only move
/// forward, each move named below, so a repeated, late or reordered message
/// never lends a place twice or strands one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BorrowState {
    /// The home has not answered.
    Asked,
    /// The home lent the place.
    Lent,
    /// The home refused (or the ask was no valid borrow).
    Refused,
    /// The borrower gave the place back; the home has not yet taken it.
    Returning,
    /// Home again, or never lent: the id is spent.
    Returned,
}

impl BorrowState {
    /// Every state, in the order a borrow may pass through them.
    pub const ALL: [Self; 5] = [
        Self::Asked,
        Self::Lent,
        Self::Refused,
        Self::Returning,
        Self::Returned,
    ];

    /// The state of a new ask: relayed if it names the user's true home
    /// for a global SKU, refused otherwise.
    pub fn asked(valid: bool) -> Self {
        if valid {
            Self::Asked
        } else {
            Self::Refused
        }
    }

    /// The borrower gives the place back. A return for an id never asked
    /// is recorded [`Self::Returned`] first, so a late ask finds it spent.
    pub fn on_return(self) -> Option<Self> {
        match self {
            Self::Asked | Self::Lent => Some(Self::Returning),
            Self::Refused => Some(Self::Returned),
            Self::Returning | Self::Returned => None,
        }
    }

    /// The home answers an ask. An answer to a borrow already given back
    /// matters only if it refused: then nothing is out.
    pub fn on_answer(self, lent: bool) -> Option<Self> {
        match self {
            Self::Asked if lent => Some(Self::Lent),
            Self::Asked => Some(Self::Refused),
            Self::Returning if !lent => Some(Self::Returned),
            _ => None,
        }
    }

    /// The home took the place back.
    pub fn on_taken_back(self) -> Option<Self> {
        match self {
            Self::Returning => Some(Self::Returned),
            _ => None,
        }
    }

    /// What the borrower is told of its ask: lent, refused, or nothing yet
    /// (a borrow it has given back waits for [`Self::Returned`]).
    pub fn answer(self) -> Option<bool> {
        match self {
            Self::Lent => Some(true),
            Self::Refused => Some(false),
            _ => None,
        }
    }

    /// What the borrowing region hears of borrow `id` once it moved to
    /// this state: the home's answer, if there is one.
    pub fn borrower_news(self, id: &TransferId) -> LimitsDown {
        LimitsDown {
            answers: self
                .answer()
                .map(|lent| LendAnswer {
                    id: id.clone(),
                    lent,
                })
                .into_iter()
                .collect(),
            ..LimitsDown::default()
        }
    }

    /// The state as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Asked => "ASKED",
            Self::Lent => "LENT",
            Self::Refused => "REFUSED",
            Self::Returning => "RETURNING",
            Self::Returned => "RETURNED",
        }
    }

    /// A stored state.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// 64-bit FNV-1a over `parts` in order: fixed by its definition, so the
/// home of a user never moves with a compiler or library version (std's
/// hasher promises no such thing).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(OFFSET, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regions(names: &[&str]) -> Vec<RegionName> {
        names
            .iter()
            .map(|n| RegionName::parse(n).unwrap())
            .collect()
    }

    fn user(id: &str) -> UserId {
        UserId::parse(id).unwrap()
    }

    /// Goal: FNV-1a is the published function (its test vectors), so a
    /// user's home cannot move between builds.
    #[test]
    fn fnv1a_matches_its_test_vectors() {
        assert_eq!(fnv1a(&[b""]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(&[b"foo"]), 0xdcb2_7518_fed9_d577);
        assert_eq!(fnv1a(&[b"fo", b"o"]), fnv1a(&[b"foo"]));
    }

    /// Goal: a region named by the id's prefix is the home; any other id
    /// gets the same home whatever the order the regions are listed in,
    /// and ids spread over all regions.
    #[test]
    fn the_home_is_stable_and_spread() {
        let three = regions(&["eu", "us", "ap"]);
        let reversed = regions(&["ap", "us", "eu"]);
        assert_eq!(home_region(&user("ap:7"), &three).unwrap().as_str(), "ap");
        assert_eq!(home_region(&user("eu:u9"), &three).unwrap().as_str(), "eu");
        let mut counts = std::collections::HashMap::new();
        for n in 0..3_000 {
            let u = user(&format!("user-{n}"));
            let home = home_region(&u, &three).unwrap();
            assert_eq!(home, home_region(&u, &reversed).unwrap());
            *counts.entry(home.as_str()).or_insert(0) += 1;
        }
        for region in ["eu", "us", "ap"] {
            assert!((800..1_200).contains(&counts[region]), "{counts:?}");
        }
        assert_eq!(home_region(&user("x"), &[]), None);
    }

    /// A state's place in the order every move increases.
    fn rank(state: BorrowState) -> usize {
        match state {
            BorrowState::Asked => 0,
            BorrowState::Lent | BorrowState::Refused => 1,
            BorrowState::Returning => 2,
            BorrowState::Returned => 3,
        }
    }

    /// Goal: every move of a borrow goes forward; a place lent is asked
    /// back before it is spent, and a refused one is never lent after.
    #[test]
    fn borrows_only_move_forward() {
        use BorrowState::*;
        for state in BorrowState::ALL {
            assert_eq!(BorrowState::parse(state.as_str()), Some(state));
            let moves = [
                state.on_return(),
                state.on_answer(true),
                state.on_answer(false),
                state.on_taken_back(),
            ];
            for next in moves.into_iter().flatten() {
                assert!(rank(next) > rank(state), "{state:?} -> {next:?}");
            }
        }
        assert_eq!(Lent.on_return(), Some(Returning));
        assert_eq!(
            Returning.on_answer(true),
            None,
            "a late loan is still asked back"
        );
        assert_eq!(
            Refused.on_answer(true),
            None,
            "a refused borrow is never lent"
        );
        assert_eq!(Refused.on_return(), Some(Returned));
        assert_eq!(Returned.on_return(), None);
        assert_eq!(BorrowState::asked(false), Refused);
        assert_eq!(BorrowState::parse("lent"), None);
    }

    /// Goal: only a global SKU's user away from home needs a borrow, and a
    /// global SKU whose regions are unknown is judged by nobody.
    #[test]
    fn who_judges() {
        let three = regions(&["eu", "us", "ap"]);
        let eu = RegionName::parse("eu").unwrap();
        let u = user("us:1");
        assert_eq!(judge(UserLimitScope::Region, &u, &eu, &three), Judge::Here);
        assert_eq!(
            judge(UserLimitScope::Global, &u, &eu, &three),
            Judge::Home(RegionName::parse("us").unwrap())
        );
        assert_eq!(
            judge(UserLimitScope::Global, &user("eu:1"), &eu, &three),
            Judge::Here
        );
        assert_eq!(judge(UserLimitScope::Global, &u, &eu, &[]), Judge::Unknown);
        assert_eq!(UserLimitScope::parse("global"), Ok(UserLimitScope::Global));
        assert!(UserLimitScope::parse("GLOBAL").is_err());
    }
}
