//! The region API in SQL. A take is one transaction that locks its SKU. A
//! sync is a short transaction on the region's agent row (fencing, and its
//! standing), then one short transaction per SKU it concerns, each locking
//! that SKU alone: load it, apply its acks, returns and report and
//! rebalance it through `escrow_core::allocation`, write the result back,
//! commit. A SKU that the request does not report, return units of, or
//! owe a directive for is not touched at all.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use chrono::Utc;
use escrow_core::allocation::{self, AgentSession, SkuSynced, TakeHistory};
use escrow_core::protocol::{
    SkuDirective, SyncRequest, SyncResponse, TakeRequest, TakeResponse, TransferMsg,
};
use escrow_core::{RegionName, Sku, Tenant, TransferId};

use crate::notices::News;
use crate::policies::Policies;

use super::backend::{sql, Tx};
use super::books::{count, ident, load_region, load_to_change, save, stored, Lock};
use super::{new_grant_id, Store, StoreError};

/// Most SKUs a watch answer carries directives for; more news than this
/// is left to the sync the answer triggers.
pub const WATCH_NEWS_SKUS_MAX: usize = 64;

/// The region's agent row, locked: its session as the rules see it, and
/// the (epoch, seq) stored, which the update is conditional on.
async fn lock_session(
    conn: &mut Tx,
    region: &RegionName,
    epoch: i64,
) -> Result<(Option<AgentSession>, (i64, i64)), StoreError> {
    let inserted =
        sql("INSERT INTO regions (region, epoch, seq) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING")
            .bind(region.as_str())
            .bind(epoch)
            .execute(&mut *conn)
            .await?;
    if inserted == 1 {
        return Ok((None, (epoch, 0)));
    }
    let lock = conn.locking("FOR UPDATE");
    let row = sql(format!(
        "SELECT epoch, seq, rtt_ms FROM regions WHERE region = $1 {lock}"
    ))
    .bind(region.as_str())
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::Corrupt("region row gone under lock".into()))?;
    let (epoch, seq, rtt_ms): (i64, i64, i64) = (
        row.try_get("epoch")?,
        row.try_get("seq")?,
        row.try_get("rtt_ms")?,
    );
    let session = AgentSession {
        epoch,
        seq: count(seq, "seq")?,
        rtt_ms: count(rtt_ms, "rtt_ms")?,
    };
    Ok((Some(session), (epoch, seq)))
}

/// A SKU by (tenant, sku).
type SkuKey = (Tenant, Sku);

/// The SKUs a delta sync concerns, in (tenant, sku) order: those it
/// reports, those it returns units of, those with a grant to the region in
/// transit (so every pending grant is listed in the answer) and the
/// region's news. Read without locks: each SKU is locked on its own.
async fn delta_keys(
    conn: &mut Tx,
    region: &RegionName,
    req: &SyncRequest,
    news: &News,
) -> Result<BTreeSet<SkuKey>, StoreError> {
    let mut keys = returned_keys(req);
    keys.extend(req.skus.iter().map(|r| (r.tenant.clone(), r.sku.clone())));
    keys.extend(news.skus.iter().cloned());
    let rows = sql("SELECT DISTINCT tenant, sku FROM transfers
                    WHERE region = $1 AND kind = 'GRANT' AND state = 'PENDING'")
    .bind(region.as_str())
    .fetch_all(&mut *conn)
    .await?;
    for row in &rows {
        keys.insert((ident(row, "tenant")?, ident(row, "sku")?));
    }
    Ok(keys)
}

/// The SKUs `req` returns units of.
fn returned_keys(req: &SyncRequest) -> BTreeSet<SkuKey> {
    req.returns
        .iter()
        .map(|t| (t.tenant.clone(), t.sku.clone()))
        .collect()
}

/// Records returns as applied, so a repeat is recognised.
async fn record_returns(
    conn: &mut Tx,
    region: &RegionName,
    returns: &[TransferMsg],
) -> Result<(), StoreError> {
    for ret in returns {
        let inserted = sql(
            "INSERT INTO transfers (id, tenant, sku, region, kind, units, state, delivered_at)
             VALUES ($1, $2, $3, $4, 'RETURN', $5, 'DELIVERED', $6)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&ret.id)
        .bind(&ret.tenant)
        .bind(&ret.sku)
        .bind(region.as_str())
        .bind(stored(ret.units)?)
        .bind(Utc::now())
        .execute(&mut *conn)
        .await?;
        if inserted != 1 {
            return Err(StoreError::Invalid(format!(
                "transfer id {} already used for something else",
                ret.id
            )));
        }
        metrics::counter!("coordinator_returned_units_total").increment(ret.units);
    }
    Ok(())
}

/// The ids among `returns` that this region's RETURN transfers already
/// hold: returns applied by an earlier delivery of the same message.
async fn applied_returns(
    conn: &mut Tx,
    region: &RegionName,
    returns: &[TransferMsg],
) -> Result<HashSet<TransferId>, StoreError> {
    let mut applied = HashSet::new();
    for ret in returns {
        let found =
            sql("SELECT id FROM transfers WHERE id = $1 AND region = $2 AND kind = 'RETURN'")
                .bind(&ret.id)
                .bind(region.as_str())
                .fetch_optional(&mut *conn)
                .await?;
        if found.is_some() {
            applied.insert(ret.id.clone());
        }
    }
    Ok(applied)
}

impl Store {
    /// Applies one agent's sync, SKU by SKU, and answers with its grants
    /// and the directives it is owed. A request refused as a whole (a bad
    /// return or report, an older epoch) changes nothing; a return refused
    /// for its SKU (beyond the lease, or for a SKU the region has no part
    /// in) fails the sync after the SKUs before it committed their parts,
    /// each whole, which the agent's next sync repeats harmlessly.
    pub async fn sync(
        &self,
        region: &RegionName,
        req: &SyncRequest,
        policies: &Policies,
    ) -> Result<SyncResponse, StoreError> {
        allocation::check_sync(req)?;
        // Only the newest request takes the region's news: a duplicate or
        // late one may be answered to nobody, and the news would be lost.
        let news = if self.admit(region, req).await? {
            self.notices.take_news(region)
        } else {
            News::default()
        };
        let mut synced = self.sync_skus(region, req, &news, policies).await;
        if let Ok(response) = &mut synced {
            // Borrowed places never hold quota back: a relay that failed
            // answers nothing of them, and the next sync, which carries
            // every one again, is relayed afresh.
            match self.relay_limits(region, &req.limits).await {
                Ok(limits) => response.limits = limits,
                Err(error) => tracing::warn!(%region, %error, "relaying borrowed places failed"),
            }
        }
        if synced.is_err() {
            self.notices.restore_news(region, news);
        }
        metrics::counter!("coordinator_syncs_total", "region" => region.as_str().to_owned())
            .increment(1);
        synced
    }

    /// Fences an older agent process and stores the region's standing when
    /// the request is the newest seen (then `true`): one short transaction
    /// on the region's agent row.
    async fn admit(&self, region: &RegionName, req: &SyncRequest) -> Result<bool, StoreError> {
        let mut tx = self.db.write().await?;
        let (session, (epoch_was, seq_was)) = lock_session(&mut tx, region, req.epoch).await?;
        let admitted = allocation::admit(session, req)?;
        if let Some(session) = admitted {
            let changed = sql(
                "UPDATE regions SET epoch = $2, seq = $3, rtt_ms = $4, last_sync_at = $7
                 WHERE region = $1 AND epoch = $5 AND seq = $6",
            )
            .bind(region.as_str())
            .bind(session.epoch)
            .bind(stored(session.seq)?)
            .bind(stored(session.rtt_ms)?)
            .bind(epoch_was)
            .bind(seq_was)
            .bind(Utc::now())
            .execute(&mut tx)
            .await?;
            if changed != 1 {
                return Err(StoreError::Corrupt("region row changed under lock".into()));
            }
        }
        tx.commit().await?;
        Ok(admitted.is_some())
    }

    /// Each SKU the sync concerns in its own transaction; the answer. A
    /// full sync (or news of everything) reads every SKU of the region in
    /// one snapshot first, and locks only those whose part could change
    /// something (`Allocation::sync_changes`) or that have news; the others'
    /// directives and pending grants come from the snapshot, which was read
    /// after the news was taken, so it is at least as new as what the news
    /// would answer.
    async fn sync_skus(
        &self,
        region: &RegionName,
        req: &SyncRequest,
        news: &News,
        policies: &Policies,
    ) -> Result<SyncResponse, StoreError> {
        let mut response = SyncResponse {
            limits: Default::default(),
            grants: Vec::new(),
            confirmed: req.acks.clone(),
            applied_returns: req.returns.iter().map(|t| t.id.clone()).collect(),
            skus: Vec::new(),
        };
        let mut tx = self.db.snapshot().await?;
        let keys = if req.full || news.all {
            let mut keys = returned_keys(req);
            for loaded in load_region(&mut tx, region).await? {
                let index = loaded
                    .index_of(region)
                    .ok_or_else(|| StoreError::Corrupt("a region's SKU without it".into()))?;
                let key = (
                    loaded.allocation.tenant.clone(),
                    loaded.allocation.sku.clone(),
                );
                if news.skus.contains(&key) || loaded.allocation.sync_changes(index, req) {
                    keys.insert(key);
                } else if !keys.contains(&key) {
                    response
                        .grants
                        .extend(loaded.allocation.pending_grants(index));
                    response.skus.push(loaded.directive(index));
                }
            }
            keys
        } else {
            delta_keys(&mut tx, region, req, news).await?
        };
        tx.commit().await?;
        let now_ms = count(Utc::now().timestamp_millis(), "clock")?;
        for key in &keys {
            if let Some(synced) = self.sync_sku(region, req, key, now_ms, policies).await? {
                response.grants.extend(synced.grants);
                response.skus.push(synced.directive);
            }
        }
        response
            .skus
            .sort_by(|a, b| (&a.tenant, &a.sku).cmp(&(&b.tenant, &b.sku)));
        Ok(response)
    }

    /// One SKU's part of a sync, in one transaction that locks that SKU
    /// only. `None`: the region has no part in the SKU (and returns none of
    /// it), so there is nothing to apply or answer.
    async fn sync_sku(
        &self,
        region: &RegionName,
        req: &SyncRequest,
        (tenant, sku): &SkuKey,
        now_ms: u64,
        policies: &Policies,
    ) -> Result<Option<SkuSynced>, StoreError> {
        let returns: Vec<TransferMsg> = req
            .returns
            .iter()
            .filter(|t| (&t.tenant, &t.sku) == (tenant, sku))
            .cloned()
            .collect();
        let mut tx = self.db.write().await?;
        let loaded = load_to_change(&mut tx, tenant, sku, Lock::ForUpdate).await?;
        let Some((mut loaded, index)) =
            loaded.and_then(|l| l.index_of(region).map(|index| (l, index)))
        else {
            return match returns.first() {
                Some(ret) => Err(StoreError::Invalid(format!(
                    "return for a SKU this region has no part in: {}",
                    ret.id
                ))),
                None => Ok(None),
            };
        };
        let applied_before = applied_returns(&mut tx, region, &returns).await?;
        let before = loaded.allocation.clone();
        let policy = policies.of(loaded.policy.as_ref()).build();
        let mut synced = loaded.allocation.sync(
            index,
            req,
            &applied_before,
            now_ms,
            policy.as_ref(),
            &mut new_grant_id,
        )?;
        synced.directive.limit_regions = loaded.limit_regions();
        save(&mut tx, Some(&before), &loaded.allocation, &loaded.names).await?;
        record_returns(&mut tx, region, &synced.applied).await?;
        tx.commit().await?;
        self.observe(
            Some(&before),
            &loaded.allocation,
            &loaded.names,
            &synced.moves,
            Some(index),
        );
        Ok(Some(synced))
    }

    /// What a watch answer carries for `region`: for each SKU with news
    /// (at most [`WATCH_NEWS_SKUS_MAX`]), its pending grants to the region
    /// and its directive, read in one snapshot without locks. Nothing for
    /// an agent whose `epoch` is not the region's current one (a fenced
    /// process must not be handed units), nor when the news is
    /// "everything" or longer than the bound: the sync that follows
    /// answers those.
    pub async fn watch_news(
        &self,
        region: &RegionName,
        epoch: i64,
    ) -> Result<(Vec<TransferMsg>, Vec<SkuDirective>), StoreError> {
        let news = self.notices.peek_news(region);
        let (mut grants, mut skus) = (Vec::new(), Vec::new());
        if news.all || news.skus.is_empty() || news.skus.len() > WATCH_NEWS_SKUS_MAX {
            return Ok((grants, skus));
        }
        let mut tx = self.db.snapshot().await?;
        let current: Option<i64> = sql("SELECT epoch FROM regions WHERE region = $1")
            .bind(region.as_str())
            .fetch_optional(&mut tx)
            .await?
            .map(|row| row.try_get("epoch"))
            .transpose()?;
        if current == Some(epoch) {
            for (tenant, sku) in &news.skus {
                let loaded = load_to_change(&mut tx, tenant, sku, Lock::None).await?;
                if let Some((loaded, index)) =
                    loaded.and_then(|l| l.index_of(region).map(|index| (l, index)))
                {
                    grants.extend(loaded.allocation.pending_grants(index));
                    skus.push(loaded.directive(index));
                }
            }
        }
        tx.commit().await?;
        Ok((grants, skus))
    }

    /// A synchronous take: grant up to `units` from the pool now, and say
    /// whether anything is left anywhere.
    pub async fn take(
        &self,
        region: &RegionName,
        req: &TakeRequest,
        policies: &Policies,
    ) -> Result<TakeResponse, StoreError> {
        let mut tx = self.db.write().await?;
        let mut loaded = load_to_change(&mut tx, &req.tenant, &req.sku, Lock::ForUpdate)
            .await?
            .ok_or(StoreError::UnknownSku)?;
        let locked = Instant::now();
        let index = loaded.index_of(region).ok_or(StoreError::UnknownSku)?;
        let found = sql(
            "SELECT region = $2 AND kind = 'GRANT' AND tenant = $3 AND sku = $4 AS here, units
             FROM transfers WHERE id = $1",
        )
        .bind(&req.id)
        .bind(region.as_str())
        .bind(&req.tenant)
        .bind(&req.sku)
        .fetch_optional(&mut tx)
        .await?;
        let history = match found {
            None => TakeHistory::Unused,
            Some(row) if row.try_get("here")? => {
                TakeHistory::GrantedHere(count(row.try_get("units")?, "grant")?)
            }
            Some(_) => TakeHistory::UsedElsewhere,
        };
        let before = loaded.allocation.clone();
        let policy = policies.of(loaded.policy.as_ref()).build();
        let taken =
            loaded
                .allocation
                .take(index, req, history, policy.as_ref(), &mut new_grant_id)?;
        self.commit_change(tx, &before, &loaded, &taken.moves)
            .await?;
        metrics::histogram!("coordinator_take_locked_seconds")
            .record(locked.elapsed().as_secs_f64());
        metrics::counter!("coordinator_granted_units_total").increment(taken.granted);
        metrics::counter!("coordinator_takes_total", "sold_out_everywhere" => taken.response.sold_out_everywhere.to_string())
            .increment(1);
        metrics::counter!("coordinator_take_granted_units_total").increment(taken.granted);
        Ok(taken.response)
    }
}
