//! Request keys that already have a committed reservation, per tenant,
//! each with the SKU it reserved.
//!
//! A retry of a key that holds a reservation must get REPLAY even when the
//! SKU is sold out, yet the sold-out answer must not touch the database.
//! This map lets the request path tell the two apart from memory: a known
//! key is looked up, an unknown one on a sold-out SKU is refused at once.
//! It also routes confirm, release and extend to the owner of the key's
//! SKU without reading the row first. It holds every key committed and
//! not pruned (loaded at start), so its size is the number of reservation
//! rows; each SKU's name is stored once and shared.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use escrow_core::{RequestKey, Sku, Tenant};

/// Committed request keys by tenant, with their SKUs.
#[derive(Debug, Default)]
pub struct KnownKeys {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_tenant: HashMap<Tenant, HashMap<RequestKey, Arc<Sku>>>,
    skus: HashMap<Sku, Arc<Sku>>,
}

impl Inner {
    fn add(&mut self, tenant: &Tenant, sku: &Sku, keys: impl IntoIterator<Item = RequestKey>) {
        let shared = self
            .skus
            .entry(sku.clone())
            .or_insert_with(|| Arc::new(sku.clone()))
            .clone();
        let map = self.by_tenant.entry(tenant.clone()).or_default();
        for key in keys {
            map.insert(key, shared.clone());
        }
    }
}

impl KnownKeys {
    /// Whether `key` has a committed reservation for `tenant`.
    pub fn contains(&self, tenant: &Tenant, key: &RequestKey) -> bool {
        self.sku_of(tenant, key).is_some()
    }

    /// The SKU `key` reserved for `tenant`, if it has a committed reservation.
    pub fn sku_of(&self, tenant: &Tenant, key: &RequestKey) -> Option<Arc<Sku>> {
        // A poisoned lock means a panic elsewhere while inserting; the map itself is still valid.
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.by_tenant.get(tenant)?.get(key).cloned()
    }

    /// Records a newly committed key of `sku`.
    pub fn insert(&self, tenant: &Tenant, sku: &Sku, key: RequestKey) {
        self.extend(tenant, sku, [key]);
    }

    /// Forgets `key` of `tenant`: its reservation was pruned.
    pub fn remove(&self, tenant: &Tenant, key: &RequestKey) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(keys) = inner.by_tenant.get_mut(tenant) {
            keys.remove(key);
        }
    }

    /// Gives back the room forgotten keys left, after a prune.
    pub fn shrink(&self) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        for keys in inner.by_tenant.values_mut() {
            keys.shrink_to_fit();
        }
    }

    /// Records many committed keys of `sku`.
    pub fn extend(&self, tenant: &Tenant, sku: &Sku, keys: impl IntoIterator<Item = RequestKey>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.add(tenant, sku, keys);
    }
}
