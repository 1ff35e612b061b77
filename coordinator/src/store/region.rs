//! The region API in SQL: a sync or a take is one transaction that locks
//! the region's agent row and the SKUs concerned, loads them, calls
//! `escrow_core::allocation`, and writes the result back.

use std::collections::HashSet;

use chrono::Utc;
use escrow_core::allocation::{self, AgentSession, Participant, TakeHistory};
use escrow_core::protocol::{SyncRequest, SyncResponse, TakeRequest, TakeResponse, TransferMsg};
use escrow_core::{Policy, RegionName};

use crate::policies::Policies;

use super::backend::{sql, Tx};
use super::books::{count, load_to_change, save, stored, Loaded, Lock};
use super::{new_grant_id, Store, StoreError};

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

/// Loads, locked and in (tenant, sku) order, every SKU `region` takes part in.
async fn lock_region_skus(conn: &mut Tx, region: &RegionName) -> Result<Vec<Loaded>, StoreError> {
    let lock = conn.locking("FOR UPDATE OF s");
    let keys = sql(format!(
        "SELECT s.tenant, s.sku FROM skus s JOIN sku_regions r USING (tenant, sku)
         WHERE r.region = $1 ORDER BY s.tenant, s.sku {lock}"
    ))
    .bind(region.as_str())
    .fetch_all(&mut *conn)
    .await?;
    let mut skus = Vec::with_capacity(keys.len());
    for key in &keys {
        let (tenant, sku): (String, String) = (key.try_get("tenant")?, key.try_get("sku")?);
        let loaded = load_to_change(conn, &tenant, &sku, Lock::None)
            .await?
            .ok_or(StoreError::UnknownSku)?;
        skus.push(loaded);
    }
    Ok(skus)
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
) -> Result<HashSet<String>, StoreError> {
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
    /// Applies one agent's sync to every SKU its region takes part in, in
    /// one transaction, and answers with its grants and directives.
    pub async fn sync(
        &self,
        region: &RegionName,
        req: &SyncRequest,
        policies: &Policies,
    ) -> Result<SyncResponse, StoreError> {
        let now_ms = count(Utc::now().timestamp_millis(), "clock")?;
        let seq = stored(req.seq)?;
        let mut tx = self.db.write().await?;
        let (session, (epoch_was, seq_was)) = lock_session(&mut tx, region, req.epoch).await?;
        let mut skus = lock_region_skus(&mut tx, region).await?;
        let applied_before = applied_returns(&mut tx, region, &req.returns).await?;

        let before: Vec<_> = skus.iter().map(|l| l.allocation.clone()).collect();
        let built: Vec<Box<dyn Policy>> = skus
            .iter()
            .map(|l| policies.of(l.policy.as_ref()).build())
            .collect();
        let mut participants = Vec::with_capacity(skus.len());
        for (loaded, policy) in skus.iter_mut().zip(&built) {
            let index = loaded.index_of(region).ok_or(StoreError::UnknownSku)?;
            participants.push(Participant {
                allocation: &mut loaded.allocation,
                region: index,
                policy: policy.as_ref(),
            });
        }
        let synced = allocation::sync(
            &mut participants,
            session,
            req,
            &applied_before,
            now_ms,
            &mut new_grant_id,
        )?;

        for (loaded, before) in skus.iter().zip(&before) {
            save(&mut tx, Some(before), &loaded.allocation, &loaded.names).await?;
        }
        record_returns(&mut tx, region, &synced.applied).await?;
        if let Some(session) = synced.session {
            let changed = sql(
                "UPDATE regions SET epoch = $2, seq = $3, rtt_ms = $4, last_sync_at = $7
                 WHERE region = $1 AND epoch = $5 AND seq = $6",
            )
            .bind(region.as_str())
            .bind(session.epoch)
            .bind(seq)
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
        for (loaded, moves) in skus.iter().zip(&synced.moves) {
            self.observe(&loaded.allocation, &loaded.names, moves);
        }
        metrics::counter!("coordinator_syncs_total", "region" => region.as_str().to_owned())
            .increment(1);
        Ok(synced.response)
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
        save(&mut tx, Some(&before), &loaded.allocation, &loaded.names).await?;
        tx.commit().await?;
        self.observe(&loaded.allocation, &loaded.names, &taken.moves);
        metrics::counter!("coordinator_granted_units_total").increment(taken.granted);
        metrics::counter!("coordinator_takes_total", "exhausted" => taken.response.exhausted.to_string())
            .increment(1);
        metrics::counter!("coordinator_take_granted_units_total").increment(taken.granted);
        Ok(taken.response)
    }
}
