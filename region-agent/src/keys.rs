//! Request keys that already have a committed reservation, per tenant.
//!
//! A retry of a key that holds a reservation must get REPLAY even when the
//! SKU is sold out, yet the sold-out answer must not touch the database.
//! This set lets the request path tell the two apart from memory: a known
//! key is looked up, an unknown one on a sold-out SKU is refused at once.
//! It holds every key ever committed (loaded at start), so its size is the
//! number of reservation rows.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use escrow_core::{RequestKey, Tenant};

/// Committed request keys by tenant.
#[derive(Debug, Default)]
pub struct KnownKeys {
    by_tenant: RwLock<HashMap<Tenant, HashSet<RequestKey>>>,
}

impl KnownKeys {
    /// Whether `key` has a committed reservation for `tenant`.
    pub fn contains(&self, tenant: &Tenant, key: &RequestKey) -> bool {
        // A poisoned lock means a panic elsewhere while inserting; the set itself is still valid.
        let map = self.by_tenant.read().unwrap_or_else(|e| e.into_inner());
        map.get(tenant).is_some_and(|keys| keys.contains(key))
    }

    /// Records a newly committed key.
    pub fn insert(&self, tenant: &Tenant, key: RequestKey) {
        let mut map = self.by_tenant.write().unwrap_or_else(|e| e.into_inner());
        map.entry(tenant.clone()).or_default().insert(key);
    }

    /// Records many committed keys.
    pub fn extend(&self, tenant: &Tenant, keys: impl IntoIterator<Item = RequestKey>) {
        let mut map = self.by_tenant.write().unwrap_or_else(|e| e.into_inner());
        map.entry(tenant.clone()).or_default().extend(keys);
    }
}
