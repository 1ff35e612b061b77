//! The SKU owners of this agent, by (tenant, sku).
//!
//! Request handlers find an owner here; admins create SKUs here. Creation is
//! serialised so two concurrent PUTs of a new SKU start one owner.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use escrow_core::{Sku, SkuSettings, Tenant};
use tokio::task::JoinHandle;

use crate::owner::{self, OwnerDeps, OwnerHandle};
use crate::store::{SkuRecord, StoreError};

/// All owners of this agent.
pub struct Registry {
    deps: OwnerDeps,
    owners: RwLock<HashMap<(Tenant, Sku), OwnerHandle>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    creating: tokio::sync::Mutex<()>,
}

impl Registry {
    /// An empty registry whose owners share `deps`.
    pub fn new(deps: OwnerDeps) -> Self {
        Self {
            deps,
            owners: RwLock::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    /// The owner of a SKU, if it exists.
    pub fn get(&self, tenant: &Tenant, sku: &Sku) -> Option<OwnerHandle> {
        // Lock poisoning would need a panic while inserting; the map stays consistent.
        let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
        owners.get(&(tenant.clone(), sku.clone())).cloned()
    }

    /// Every owner, sorted by tenant and SKU.
    pub fn all(&self) -> Vec<OwnerHandle> {
        let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = owners.values().cloned().collect();
        all.sort_by(|a, b| (&a.view.tenant, &a.view.sku).cmp(&(&b.view.tenant, &b.view.sku)));
        all
    }

    /// Starts the owner of a SKU loaded from the store.
    pub fn start(&self, record: SkuRecord) -> OwnerHandle {
        let key = (record.tenant.clone(), record.sku.clone());
        let (handle, task) = owner::spawn(self.deps.clone(), record);
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
        self.owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, handle.clone());
        handle
    }

    /// Creates a SKU with `total` units and starts its owner; `None` if it already existed.
    pub async fn create(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        settings: SkuSettings,
        total: u64,
    ) -> Result<Option<OwnerHandle>, StoreError> {
        let _one_at_a_time = self.creating.lock().await;
        if self.get(tenant, sku).is_some() {
            return Ok(None);
        }
        let store = &self.deps.store;
        let created = store
            .create_sku(self.deps.fence.epoch(), tenant, sku, settings, total)
            .await;
        if let Err(StoreError::Fenced) = created {
            self.deps.fence.set_fenced();
        }
        created?;
        let record = store
            .load_sku(tenant, sku)
            .await?
            .ok_or_else(|| StoreError::Conflict("created SKU not found".into()))?;
        Ok(Some(self.start(record)))
    }

    /// Closes every queue and returns the owner tasks, which finish once
    /// they have answered everything already queued.
    pub fn close(&self) -> Vec<JoinHandle<()>> {
        self.owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
