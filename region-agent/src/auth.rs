//! Bearer tokens: tenant keys for the buyer API, one admin token.
//!
//! Tokens are compared in constant time and every configured key is
//! compared on each request, so timing reveals neither a key nor which
//! tenant matched.

use axum::http::HeaderMap;
use escrow_core::Tenant;
use service_kit::{bearer, token_matches};

/// The agent's credentials.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    tenants: Vec<(Tenant, Vec<u8>)>,
    admin: Option<Vec<u8>>,
}

impl Auth {
    /// Credentials from `(tenant, key)` pairs and an optional admin token
    /// (without one, the admin API refuses everyone).
    pub fn new(tenants: Vec<(Tenant, String)>, admin: Option<String>) -> Self {
        Self {
            tenants: tenants
                .into_iter()
                .map(|(t, k)| (t, k.into_bytes()))
                .collect(),
            admin: admin.filter(|a| !a.is_empty()).map(String::into_bytes),
        }
    }

    /// The tenant whose key the request carries.
    pub fn tenant(&self, headers: &HeaderMap) -> Option<Tenant> {
        let token = bearer(headers)?;
        let mut found = None;
        for (tenant, key) in &self.tenants {
            if token_matches(key, token) {
                found = Some(tenant.clone());
            }
        }
        found
    }

    /// Whether the request carries the admin token.
    pub fn is_admin(&self, headers: &HeaderMap) -> bool {
        match (&self.admin, bearer(headers)) {
            (Some(admin), Some(token)) => token_matches(admin, token),
            _ => false,
        }
    }
}

/// Parses `TENANT=KEY` pairs from the command line.
pub fn parse_tenant_key(raw: &str) -> Result<(Tenant, String), String> {
    let (tenant, key) = raw
        .split_once('=')
        .ok_or_else(|| "expected TENANT=KEY".to_owned())?;
    let tenant = Tenant::parse(tenant).map_err(|e| e.to_string())?;
    if key.is_empty() {
        return Err("empty key".to_owned());
    }
    Ok((tenant, key.to_owned()))
}
