//! The admin API's changes in SQL: create and change SKUs, add stock,
//! pause and resume, each a transaction around `escrow_core::allocation`.
//! What the admin API reads is the read model in `view`.

mod view;

use chrono::Utc;
use escrow_core::{Allocation, Moves, RegionName, Sku, SkuSettings, Tenant, UserLimitScope};

use super::backend::{sql, Tx};
use super::books::{load_to_change, save, save_policy, stored, Loaded, Lock};
use super::{new_grant_id, Store, StoreError};
use crate::policies::{Policies, PolicyRequest};

pub use view::{
    report_is_stale, Audit, Listing, RegionSummary, RegionSync, SkuLine, SkuPage, SkuSummary,
    ViewAt,
};

/// Weights for `loaded`'s regions from an admin's `weights`: a region left
/// out gets 0 (retired), a region not yet in the SKU joins at the end.
fn reweigh(loaded: &mut Loaded, weights: &[(RegionName, u32)]) -> Vec<u32> {
    let mut out: Vec<u32> = loaded
        .names
        .iter()
        .map(|n| weights.iter().find(|(r, _)| r == n).map_or(0, |(_, w)| *w))
        .collect();
    for (region, weight) in weights {
        if !loaded.names.contains(region) {
            loaded.names.push(region.clone());
            out.push(*weight);
        }
    }
    out
}

/// An admin change's idempotency key and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminKey {
    /// The client's `Idempotency-Key`.
    pub key: String,
    /// The change it names, in a canonical text: the same request gives
    /// the same text.
    pub operation: String,
}

/// What an admin change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new SKU.
    Created,
    /// An existing SKU changed.
    Changed,
    /// The same change with the same key was applied before; nothing now.
    Replayed,
}

/// Records `key` in `tx`, the change's own transaction: `true` if the
/// change is new, `false` if this very change was recorded before (then
/// nothing is to be applied); a key recorded for another change is refused.
async fn claim(tx: &mut Tx, key: Option<&AdminKey>) -> Result<bool, StoreError> {
    let Some(key) = key else {
        return Ok(true);
    };
    if key.key.is_empty() || key.key.len() > 128 {
        return Err(StoreError::Invalid(
            "Idempotency-Key must be 1 to 128 characters".into(),
        ));
    }
    let inserted = sql("INSERT INTO admin_requests (key, operation, created_at)
                        VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
    .bind(key.key.as_str())
    .bind(key.operation.as_str())
    .bind(Utc::now())
    .execute(tx)
    .await?;
    if inserted == 1 {
        return Ok(true);
    }
    let row = sql("SELECT operation FROM admin_requests WHERE key = $1")
        .bind(key.key.as_str())
        .fetch_optional(tx)
        .await?
        .ok_or_else(|| StoreError::Corrupt("admin request key vanished under lock".into()))?;
    let operation: String = row.try_get("operation")?;
    if operation == key.operation {
        Ok(false)
    } else {
        Err(StoreError::Conflict(format!(
            "Idempotency-Key {} was used for another change: {operation}",
            key.key
        )))
    }
}

impl Store {
    /// Creates a SKU or changes it, then rebalances it under the policy it
    /// runs after the change; with a `key` seen before for the same
    /// change, does nothing.
    pub async fn put_sku(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        spec: &SkuSpec,
        policies: &Policies,
        key: Option<&AdminKey>,
    ) -> Result<Applied, StoreError> {
        let invalid = |e: escrow_core::IdError| StoreError::Invalid(e.to_string());
        let mut tx = self.db.write().await?;
        if !claim(&mut tx, key).await? {
            return Ok(Applied::Replayed);
        }
        let existing = load_to_change(&mut tx, tenant, sku, Lock::ForUpdate).await?;
        let created = existing.is_none();
        let stored_policy = existing.as_ref().and_then(|l| l.policy.as_ref());
        let chosen = policies
            .choose(stored_policy, &spec.policy)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let policy_changed = chosen.as_ref() != stored_policy;
        let policy = policies.of(chosen.as_ref()).build();
        let policy = policy.as_ref();
        let (before, mut loaded, split) = match existing {
            None => {
                let settings = SkuSettings::parse(spec.max_per_user, spec.hold_ttl_ms)
                    .map_err(invalid)?
                    .with_scope(spec.user_limit_scope.unwrap_or_default());
                let regions = spec.regions.clone().unwrap_or_default();
                let weights: Vec<u32> = regions.iter().map(|(_, w)| *w).collect();
                let (allocation, split) = Allocation::create(
                    tenant.clone(),
                    sku.clone(),
                    spec.total,
                    settings,
                    &weights,
                    policy,
                    &mut new_grant_id,
                );
                let names = regions.into_iter().map(|(r, _)| r).collect();
                let loaded = Loaded {
                    allocation,
                    names,
                    policy: None,
                };
                (None, loaded, split)
            }
            Some(mut loaded) => {
                let before = loaded.allocation.clone();
                let current = before.settings;
                let scope = current.user_limit_scope;
                if spec.user_limit_scope.is_some_and(|asked| asked != scope) {
                    // Holds and loans made under one scope do not count
                    // under the other: a user could go over the limit.
                    return Err(StoreError::Conflict(
                        "user_limit_scope is chosen when a SKU is created".into(),
                    ));
                }
                loaded.allocation.settings = SkuSettings::parse(
                    Some(spec.max_per_user.unwrap_or(i64::from(current.max_per_user))),
                    Some(spec.hold_ttl_ms.unwrap_or(stored(current.hold_ttl.get())?)),
                )
                .map_err(invalid)?
                .with_scope(scope);
                loaded.allocation.set_total(spec.total)?;
                if let Some(weights) = &spec.regions {
                    let known = loaded.names.len();
                    let weights = reweigh(&mut loaded, weights);
                    if scope == UserLimitScope::Global && loaded.names.len() != known {
                        // A new region would move some users' home regions
                        // away from the rows that judge them.
                        return Err(StoreError::Conflict(
                            "a global-scope SKU's regions are fixed when it is created".into(),
                        ));
                    }
                    loaded.allocation.set_weights(&weights);
                }
                (Some(before), loaded, Default::default())
            }
        };
        let moves = loaded.allocation.rebalance(policy, &mut new_grant_id);
        save(&mut tx, before.as_ref(), &loaded.allocation, &loaded.names).await?;
        if policy_changed {
            save_policy(&mut tx, tenant, sku, chosen.as_ref()).await?;
        }
        tx.commit().await?;
        self.observe(
            before.as_ref(),
            &loaded.allocation,
            &loaded.names,
            &split,
            None,
        );
        self.observe(
            before.as_ref(),
            &loaded.allocation,
            &loaded.names,
            &moves,
            None,
        );
        Ok(if created {
            Applied::Created
        } else {
            Applied::Changed
        })
    }

    /// Adds units to a SKU's pool (and total), then rebalances it.
    pub async fn add_stock(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        units: u64,
        policies: &Policies,
        key: Option<&AdminKey>,
    ) -> Result<Applied, StoreError> {
        self.change(tenant, sku, key, |loaded| {
            let policy = policies.of(loaded.policy.as_ref()).build();
            loaded.allocation.add_stock(units);
            loaded
                .allocation
                .rebalance(policy.as_ref(), &mut new_grant_id)
        })
        .await
    }

    /// Pauses or resumes a SKU everywhere (agents learn it at their next
    /// sync, as news).
    pub async fn set_paused(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        paused: bool,
        key: Option<&AdminKey>,
    ) -> Result<Applied, StoreError> {
        self.change(tenant, sku, key, |loaded| {
            loaded.allocation.paused = paused;
            Moves::default()
        })
        .await
    }

    /// Locks and loads a SKU, applies `change` to it and writes the result,
    /// in one transaction (none if `key` shows it was applied before).
    async fn change(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        key: Option<&AdminKey>,
        change: impl FnOnce(&mut Loaded) -> Moves,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.db.write().await?;
        if !claim(&mut tx, key).await? {
            return Ok(Applied::Replayed);
        }
        let mut loaded = load_to_change(&mut tx, tenant, sku, Lock::ForUpdate)
            .await?
            .ok_or(StoreError::UnknownSku)?;
        let before = loaded.allocation.clone();
        let moves = change(&mut loaded);
        self.commit_change(tx, &before, &loaded, &moves).await?;
        Ok(Applied::Changed)
    }
}

/// Requested settings of a SKU.
#[derive(Debug, Clone)]
pub struct SkuSpec {
    /// Units in all.
    pub total: u64,
    /// Region weights; `None` keeps the current ones.
    pub regions: Option<Vec<(RegionName, u32)>>,
    /// Per-user limit and hold duration; `None` keeps the current ones (or defaults).
    pub max_per_user: Option<i64>,
    /// Default hold duration in ms.
    pub hold_ttl_ms: Option<i64>,
    /// The per-user limit's scope; `None` keeps it (a new SKU: `region`).
    pub user_limit_scope: Option<UserLimitScope>,
    /// The SKU's policy; an empty request keeps the current one.
    pub policy: PolicyRequest,
}
