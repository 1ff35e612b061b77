//! Bearer tokens: one admin token, one token per region.
//!
//! A region's token authorises only that region's sync and take: a token
//! presented on another region's path is 403, an unknown token 401. Every
//! configured token is compared in constant time on each request.

use axum::http::HeaderMap;
use escrow_core::RegionName;
use service_kit::{bearer, token_matches};

/// The coordinator's credentials.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    admin: Option<Vec<u8>>,
    regions: Vec<(RegionName, Vec<u8>)>,
}

/// Whether a request may act for a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionAccess {
    /// The token is this region's.
    Granted,
    /// The token is another region's.
    Forbidden,
    /// No token, or one nobody has.
    Unauthenticated,
}

impl Auth {
    /// Credentials from an admin token and `(region, token)` pairs.
    pub fn new(admin: Option<String>, regions: Vec<(RegionName, String)>) -> Self {
        Self {
            admin: admin.filter(|a| !a.is_empty()).map(String::into_bytes),
            regions: regions
                .into_iter()
                .map(|(r, t)| (r, t.into_bytes()))
                .collect(),
        }
    }

    /// Whether the request carries the admin token.
    pub fn is_admin(&self, headers: &HeaderMap) -> bool {
        match (&self.admin, bearer(headers)) {
            (Some(admin), Some(token)) => token_matches(admin, token),
            _ => false,
        }
    }

    /// Whether `region` has a token, i.e. an agent can ever sync for it.
    pub fn knows_region(&self, region: &RegionName) -> bool {
        self.regions.iter().any(|(name, _)| name == region)
    }

    /// Whether the request may act for `region`.
    pub fn region(&self, headers: &HeaderMap, region: &RegionName) -> RegionAccess {
        let Some(token) = bearer(headers) else {
            return RegionAccess::Unauthenticated;
        };
        let mut access = RegionAccess::Unauthenticated;
        for (name, secret) in &self.regions {
            if token_matches(secret, token) {
                access = if name == region {
                    RegionAccess::Granted
                } else {
                    RegionAccess::Forbidden
                };
            }
        }
        access
    }
}

/// Parses `REGION=TOKEN` from the command line.
pub fn parse_region_token(raw: &str) -> Result<(RegionName, String), String> {
    let (region, token) = raw
        .split_once('=')
        .ok_or_else(|| "expected REGION=TOKEN".to_owned())?;
    let region = RegionName::parse(region).map_err(|e| e.to_string())?;
    if token.is_empty() {
        return Err("empty token".to_owned());
    }
    Ok((region, token.to_owned()))
}
