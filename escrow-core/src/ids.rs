//! Typed identifiers and bounded quantities.
//!
//! Every value that crosses the API boundary is parsed once into one of these
//! types; code further in never re-checks a raw string. The rules are the
//! contract's: identifiers are 1..=128 characters of `[A-Za-z0-9._:-]`,
//! regions 1..=32 of `[a-z0-9-]`, quantities 1..=max_per_user and hold
//! durations 1_000..=3_600_000 ms.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::user_limit::UserLimitScope;

/// Longest identifier accepted (tenant, sku, user id, request key).
pub const ID_LEN_MAX: usize = 128;
/// Longest region name accepted.
pub const REGION_LEN_MAX: usize = 32;
/// Shortest hold a buyer may ask for.
pub const TTL_MS_MIN: u64 = 1_000;
/// Longest hold a buyer may ask for.
pub const TTL_MS_MAX: u64 = 3_600_000;
/// Hold duration of a SKU created without one.
pub const HOLD_TTL_MS_DEFAULT: u64 = 600_000;
/// Largest `max_per_user` an admin may set; bounds a single reservation.
pub const MAX_PER_USER_MAX: u32 = 1_000;

/// Why a raw value was refused. The message names the field, never internals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The value is empty or longer than allowed.
    #[error("{field} must be 1..={max} characters")]
    Length {
        /// The offending field.
        field: &'static str,
        /// Its maximum length.
        max: usize,
    },
    /// The value holds a character outside its alphabet.
    #[error("{field} may only contain {alphabet}")]
    Alphabet {
        /// The offending field.
        field: &'static str,
        /// The characters allowed.
        alphabet: &'static str,
    },
    /// A number outside its range.
    #[error("{field} must be an integer in {min}..={max}")]
    Range {
        /// The offending field.
        field: &'static str,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
}

fn check_ident(field: &'static str, raw: &str) -> Result<(), IdError> {
    if raw.is_empty() || raw.len() > ID_LEN_MAX {
        return Err(IdError::Length {
            field,
            max: ID_LEN_MAX,
        });
    }
    let ok = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if !ok {
        return Err(IdError::Alphabet {
            field,
            alphabet: "[A-Za-z0-9._:-]",
        });
    }
    Ok(())
}

macro_rules! ident {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses a raw value, refusing anything outside the identifier rules.
            pub fn parse(raw: &str) -> Result<Self, IdError> {
                check_ident($field, raw)?;
                Ok(Self(raw.to_owned()))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;

            fn try_from(raw: String) -> Result<Self, IdError> {
                check_ident($field, &raw)?;
                Ok(Self(raw))
            }
        }

    };
}

ident!(
    /// A tenant: the owner of a set of SKUs, identified by its API key.
    Tenant,
    "tenant"
);
ident!(
    /// A stock-keeping unit within a tenant.
    Sku,
    "sku"
);
ident!(
    /// The buyer, as the tenant names them.
    UserId,
    "user_id"
);
ident!(
    /// The buyer's idempotency key: one key, at most one reservation.
    RequestKey,
    "request_key"
);
/// What separates a cart's key from an item's SKU in the item's key. It is
/// no identifier character, so no buyer's key is ever an item's.
const CART_ITEM_SEPARATOR: char = '/';

/// What a loan's key starts with ([`RequestKey::lend`]): the separator
/// first, so it is neither a buyer's key nor a cart item's.
const LEND_PREFIX: &str = "/lend/";

impl RequestKey {
    /// The key of `sku`'s item in the cart `cart`: `{cart}/{sku}`, the key
    /// its reservation row is stored under.
    pub fn cart_item(cart: &RequestKey, sku: &Sku) -> Self {
        Self(format!("{cart}{CART_ITEM_SEPARATOR}{sku}"))
    }

    /// The key of the row by which a home region lends a user's place to
    /// the borrow `id` ([`crate::user_limit`]): `/lend/{id}`.
    pub fn lend(id: &TransferId) -> Self {
        Self(format!("{LEND_PREFIX}{id}"))
    }

    /// The key of the cart this key is an item of, if it is one.
    pub fn cart(&self) -> Option<&str> {
        self.0.split_once(CART_ITEM_SEPARATOR).map(|(cart, _)| cart)
    }

    /// Parses a stored key: a buyer's, a cart item's ([`Self::cart_item`])
    /// or a loan's ([`Self::lend`]).
    pub fn parse_stored(raw: &str) -> Result<Self, IdError> {
        if let Some(id) = raw.strip_prefix(LEND_PREFIX) {
            return Ok(Self::lend(&TransferId::parse(id)?));
        }
        match raw.split_once(CART_ITEM_SEPARATOR) {
            Some((cart, sku)) => Ok(Self::cart_item(&Self::parse(cart)?, &Sku::parse(sku)?)),
            None => Self::parse(raw),
        }
    }
}

ident!(
    /// A transfer's id, chosen by its sender: the receiver applies each id once.
    TransferId,
    "transfer id"
);

/// A region's name, `[a-z0-9-]{1,32}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RegionName(String);

impl RegionName {
    /// Parses a region name.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if raw.is_empty() || raw.len() > REGION_LEN_MAX {
            return Err(IdError::Length {
                field: "region",
                max: REGION_LEN_MAX,
            });
        }
        let ok = raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(IdError::Alphabet {
                field: "region",
                alphabet: "[a-z0-9-]",
            });
        }
        Ok(Self(raw.to_owned()))
    }

    /// The region name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RegionName {
    type Error = IdError;

    fn try_from(raw: String) -> Result<Self, IdError> {
        Self::parse(&raw)
    }
}

impl<'de> Deserialize<'de> for RegionName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for RegionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Units in one reservation: 1..=max_per_user of its SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Qty(u32);

impl Qty {
    /// One unit.
    pub const ONE: Qty = Qty(1);

    /// Parses a requested quantity against the SKU's per-user limit.
    pub fn parse(raw: i64, max_per_user: u32) -> Result<Self, IdError> {
        if raw < 1 || raw > i64::from(max_per_user) {
            return Err(IdError::Range {
                field: "qty",
                min: 1,
                max: u64::from(max_per_user),
            });
        }
        // In range 1..=max_per_user, which fits u32.
        Ok(Self(raw as u32))
    }

    /// A quantity read back from storage, where a CHECK constraint already holds it positive.
    pub fn from_stored(raw: u32) -> Self {
        assert!(raw >= 1, "stored quantity must be positive");
        Self(raw)
    }

    /// The number of units.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The number of units, widened for counter arithmetic.
    pub fn units(self) -> u64 {
        u64::from(self.0)
    }
}

/// A hold duration in milliseconds, 1_000..=3_600_000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct TtlMs(u64);

impl TtlMs {
    /// Parses a requested hold duration.
    pub fn parse(raw: i64) -> Result<Self, IdError> {
        if raw < TTL_MS_MIN as i64 || raw > TTL_MS_MAX as i64 {
            return Err(IdError::Range {
                field: "ttl_ms",
                min: TTL_MS_MIN,
                max: TTL_MS_MAX,
            });
        }
        Ok(Self(raw as u64))
    }

    /// The duration in milliseconds.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Per-SKU settings an admin controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SkuSettings {
    /// Most units one reservation (and so one user) may hold.
    pub max_per_user: u32,
    /// Hold duration when the buyer does not ask for one.
    pub hold_ttl: TtlMs,
    /// Whether the per-user limit counts each region or all of them.
    pub user_limit_scope: UserLimitScope,
}

impl SkuSettings {
    /// Parses admin-supplied settings, applying the defaults for absent ones.
    pub fn parse(max_per_user: Option<i64>, hold_ttl_ms: Option<i64>) -> Result<Self, IdError> {
        let max_per_user = match max_per_user {
            None => 1,
            Some(raw) if (1..=i64::from(MAX_PER_USER_MAX)).contains(&raw) => raw as u32,
            Some(_) => {
                return Err(IdError::Range {
                    field: "max_per_user",
                    min: 1,
                    max: u64::from(MAX_PER_USER_MAX),
                })
            }
        };
        let hold_ttl = match hold_ttl_ms {
            None => TtlMs(HOLD_TTL_MS_DEFAULT),
            Some(raw) => TtlMs::parse(raw).map_err(|_| IdError::Range {
                field: "hold_ttl_ms",
                min: TTL_MS_MIN,
                max: TTL_MS_MAX,
            })?,
        };
        Ok(Self {
            max_per_user,
            hold_ttl,
            user_limit_scope: UserLimitScope::Region,
        })
    }

    /// These settings with `scope`.
    pub fn with_scope(self, scope: UserLimitScope) -> Self {
        Self {
            user_limit_scope: scope,
            ..self
        }
    }
}

impl Default for SkuSettings {
    fn default() -> Self {
        Self {
            max_per_user: 1,
            hold_ttl: TtlMs(HOLD_TTL_MS_DEFAULT),
            user_limit_scope: UserLimitScope::Region,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the identifier alphabet and length bounds are exactly the contract's.
    #[test]
    fn identifiers_follow_the_contract() {
        assert!(RequestKey::parse("a").is_ok());
        assert!(RequestKey::parse("A-z_0.9:x").is_ok());
        assert!(RequestKey::parse(&"k".repeat(128)).is_ok());
        assert!(RequestKey::parse(&"k".repeat(129)).is_err());
        assert!(RequestKey::parse("").is_err());
        assert!(RequestKey::parse("a b").is_err());
        assert!(RequestKey::parse("a/b").is_err());
        assert!(RequestKey::parse("é").is_err());
        assert!(RegionName::parse("eu-west-1").is_ok());
        assert!(RegionName::parse("EU").is_err());
        assert!(RegionName::parse(&"r".repeat(33)).is_err());
    }

    /// Goal: quantities and hold durations are refused outside their ranges.
    #[test]
    fn quantities_and_ttls_are_bounded() {
        assert_eq!(Qty::parse(1, 1).map(Qty::get), Ok(1));
        assert!(Qty::parse(0, 1).is_err());
        assert!(Qty::parse(-1, 5).is_err());
        assert!(Qty::parse(6, 5).is_err());
        assert!(TtlMs::parse(999).is_err());
        assert!(TtlMs::parse(1_000).is_ok());
        assert!(TtlMs::parse(3_600_000).is_ok());
        assert!(TtlMs::parse(3_600_001).is_err());
        assert_eq!(SkuSettings::parse(None, None), Ok(SkuSettings::default()));
        assert!(SkuSettings::parse(Some(0), None).is_err());
        assert!(SkuSettings::parse(None, Some(10)).is_err());
    }
}
