//! A group of batches committed in one transaction, the same SQL on both
//! backends.
//!
//! Every write is conditional and its affected-row count is checked: the
//! lease row read with this process's epoch ([`check_lease`]), holds
//! inserted with `ON CONFLICT DO NOTHING` (the primary key judges
//! idempotency, the partial unique index the per-user limit), transitions
//! applied in the order the owner decided them and guarded by
//! `status = 'HELD'` and the expiry, and the counter update checked by the
//! table's CHECK constraints. The group is one transaction: all of it or
//! none. In order: the lease; each batch's transitions, changes, grants
//! and returns ([`apply_batch`]); every batch's holds ([`insert_holds`]);
//! every batch's counters ([`move_counters`]). A batch whose own writes
//! fail, or whose counters cannot move, is named in the error, so the
//! committer can answer it alone.
//!
//! How much each counter moves is not re-derived here: each move the
//! database confirmed is made on a [`Moves`] ledger by escrow-core's own
//! rules ([`Transition::apply_to_ledger`], [`Ledger::hold`], ...).

use std::collections::{BTreeMap, HashMap, HashSet};

use escrow_core::{Ledger, LedgerError, Qty, RequestKey, TransferId, Transition};
use service_kit::db::Backend;
use service_kit::sql::{self, sql, Table, Tx};

use super::holds::HoldColumns;
use super::rows::at;
use super::{Batch, BatchError, BatchOutcome, Epoch, StockChange, StoreError};

/// Reads the lease row with our epoch, locking it FOR SHARE on PostgreSQL
/// (SQLite's write transaction holds the file's write lock already), so a
/// takeover waits for this transaction, and a transaction after a
/// takeover finds no row.
pub(super) async fn check_lease(tx: &mut Tx, epoch: Epoch) -> Result<(), StoreError> {
    let text = format!(
        "SELECT 1 FROM region_lease WHERE epoch = $1 {}",
        tx.locking("FOR SHARE")
    );
    let row = sql(text).bind(epoch.0).fetch_optional(tx).await?;
    row.map(|_| ()).ok_or(StoreError::Fenced)
}

/// Commits `batches` in `tx`, a write transaction: the lease, each batch's
/// own writes, every batch's holds and counters. Any group can take this
/// path; a batch whose own writes fail is named.
pub(super) async fn in_transaction(
    mut tx: Tx,
    epoch: Epoch,
    batches: &[&Batch],
) -> Result<Vec<BatchOutcome>, BatchError> {
    check_lease(&mut tx, epoch)
        .await
        .map_err(BatchError::whole)?;
    let outcomes = apply_group(&mut tx, batches).await?;
    commit(tx).await.map_err(BatchError::whole)?;
    Ok(outcomes)
}

/// Commits `tx`; a commit that got no answer has an unknown outcome.
pub(super) async fn commit(tx: Tx) -> Result<(), StoreError> {
    tx.commit().await.map_err(|e| match e {
        sql::Error::Unanswered(why) => StoreError::OutcomeUnknown(why),
        refused => refused.into(),
    })
}

/// Writes `batches` in `tx`, after the lease was checked and before the
/// commit: every batch's transitions ([`apply_transitions`]), each batch's
/// other writes, then every batch's holds and counters.
pub(super) async fn apply_group(
    tx: &mut Tx,
    batches: &[&Batch],
) -> Result<Vec<BatchOutcome>, BatchError> {
    let mut applied: Vec<Applied> = batches.iter().map(|_| Applied::new()).collect();
    apply_transitions(tx, batches, &mut applied).await?;
    for (index, batch) in batches.iter().enumerate() {
        apply_batch(tx, batch, &mut applied[index])
            .await
            .map_err(|error| BatchError {
                batch: Some(index),
                error,
            })?;
    }
    let inserted = insert_holds(tx, batches, &mut applied)
        .await
        .map_err(BatchError::whole)?;
    move_counters(tx, batches, &applied).await?;
    Ok(applied
        .into_iter()
        .zip(inserted)
        .map(|(applied, inserted)| BatchOutcome {
            inserted,
            applied_grants: applied.applied_grants,
        })
        .collect())
}

/// The counter moves of one batch, made by the ledger's own rules on a
/// ledger that starts at [`ORIGIN`]: what the batch adds to a stored
/// counter is where that counter ended minus where it started.
#[derive(Debug)]
struct Moves(Ledger);

/// Where every batch's moves start: balanced, and 2^60 units from zero in
/// each counter, more than any SKU holds. So no batch's moves take a
/// counter to zero (the ledger refuses none the database made), nor 2^63
/// units from where it started (the difference fits a stored `bigint`).
const ORIGIN: Ledger = Ledger {
    available: 1 << 60,
    held: 1 << 60,
    sold: 1 << 60,
    received: 4 << 60,
    returned: 1 << 60,
};

impl Moves {
    fn new() -> Self {
        Self(ORIGIN)
    }

    /// Whether the batch moves no counter.
    fn is_zero(&self) -> bool {
        self.0 == ORIGIN
    }

    /// How far the batch moves the counter `counter` picks.
    fn of(&self, counter: fn(&Ledger) -> u64) -> i64 {
        let moved = i128::from(counter(&self.0)) - i128::from(counter(&ORIGIN));
        // No batch moves a counter 2^63 units from its origin (see ORIGIN).
        i64::try_from(moved).expect("a batch moves a counter by less than 2^63 units")
    }

    /// A move the ledger refused: a batch of more units than any SKU holds.
    fn refused(error: LedgerError) -> StoreError {
        StoreError::Conflict(format!("a batch beyond any SKU's units: {error}"))
    }
}

/// What one batch wrote before the shared statements: its counter moves
/// so far and the grants the database credited.
#[derive(Debug)]
struct Applied {
    moves: Moves,
    applied_grants: Vec<TransferId>,
}

impl Applied {
    fn new() -> Self {
        Self {
            moves: Moves::new(),
            applied_grants: Vec::new(),
        }
    }
}

/// Applies what one batch writes besides its transitions, holds and
/// counters, inside `tx`: changes, grants and returns.
///
/// Holds come after all of these ([`insert_holds`]): no transition names a
/// key inserted in the same batch, and a release frees its user for a new
/// hold. Counters move once, at the end ([`move_counters`]), so no step
/// sees another's partial sums.
async fn apply_batch(tx: &mut Tx, batch: &Batch, applied: &mut Applied) -> Result<(), StoreError> {
    apply_changes(tx, batch, &mut applied.moves).await?;
    applied.applied_grants = apply_grants(tx, batch, &mut applied.moves).await?;
    debit_returns(tx, batch, &mut applied.moves).await
}

/// One decided transition of a batch: the key, its units, the change.
type Decided = (RequestKey, Qty, Transition);

/// A transition of the group: its batch's place in the group, and the
/// transition.
type Placed<'a> = (usize, &'a Decided);

/// Applies every batch's transitions, one conditional statement per kind
/// and round for the whole group ([`rounds`]), each required to change
/// every row it names. A row that did not change (a stale decision) names
/// its batch, the first in the group with one, so the committer answers
/// that batch alone and commits the rest again; each changed row moves its
/// own batch's units.
async fn apply_transitions(
    tx: &mut Tx,
    batches: &[&Batch],
    applied: &mut [Applied],
) -> Result<(), BatchError> {
    let placed: Vec<Placed> = batches
        .iter()
        .enumerate()
        .flat_map(|(b, batch)| batch.transitions.iter().map(move |d| (b, d)))
        .collect();
    for round in rounds(batches, &placed) {
        for kind in [Transition::Confirm, Transition::Release, Transition::Expire] {
            let settled: Vec<Placed> = round.iter().copied().filter(|p| p.1 .2 == kind).collect();
            let changed = settle_kind(tx, batches, &settled, kind).await?;
            moved(batches, &settled, &changed, applied)?;
        }
        let extended: Vec<Placed> = round
            .iter()
            .copied()
            .filter(|p| matches!(p.1 .2, Transition::Extend { .. }))
            .collect();
        let changed = extend(tx, batches, &extended).await?;
        moved(batches, &extended, &changed, applied)?;
    }
    Ok(())
}

/// What a statement over a round's transitions changed.
#[derive(Debug)]
enum Changed {
    /// How many rows, where the statement named one batch's keys only.
    Count(u64),
    /// Which rows, `(tenant, request_key)`, where it named several batches'.
    Rows(Vec<(String, String)>),
}

/// Splits the group's transitions into rounds so that each key's
/// transitions commit in the order they were decided: an extend then a
/// confirm of one hold must extend the HELD row and then sell it, not
/// find it SOLD already.
///
/// Round `n` holds every key's `n`-th transition (a key is its tenant's
/// `request_key`), in batch and decision order. Keys within a round are
/// distinct, so its statements touch disjoint rows and may run over lists,
/// one per kind; rounds run one after the other. A group whose batches
/// change each key once (nearly all) is one round of at most four
/// statements.
fn rounds<'a>(batches: &[&Batch], placed: &[Placed<'a>]) -> Vec<Vec<Placed<'a>>> {
    let mut seen: HashMap<(&str, &str), usize> = HashMap::with_capacity(placed.len());
    let mut rounds: Vec<Vec<Placed>> = Vec::new();
    for &(b, decided) in placed {
        let key = (batches[b].tenant.as_str(), decided.0.as_str());
        let n = seen.entry(key).or_insert(0);
        // A key's earlier transitions filled rounds 0..n, so round n exists or is next.
        if *n == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[*n].push((b, decided));
        *n += 1;
    }
    rounds
}

/// The table of a round's transitions of one kind: each row's tenant, SKU,
/// key and its batch's time.
fn transition_table<'a>(batches: &[&'a Batch], placed: &[Placed<'a>]) -> Table<'a> {
    Table::new("u")
        .column(
            "of_tenant",
            placed
                .iter()
                .map(|(b, _)| batches[*b].tenant.as_str())
                .collect::<Vec<_>>(),
        )
        .column(
            "of_sku",
            placed
                .iter()
                .map(|(b, _)| batches[*b].sku.as_str())
                .collect::<Vec<_>>(),
        )
        .column(
            "of_key",
            placed.iter().map(|(_, d)| d.0.as_str()).collect::<Vec<_>>(),
        )
        .column(
            "at",
            placed
                .iter()
                .map(|(b, _)| at(batches[*b].now_ms))
                .collect::<Vec<_>>(),
        )
}

/// Confirms, releases or expires (`kind`) the `placed` holds in one
/// statement; the rows it changed. On PostgreSQL the holds of one batch
/// are named by a list of keys (as the hot SKU's settles are), those of
/// several by a table ([`rows_by_key`]), as every round is on SQLite.
async fn settle_kind(
    tx: &mut Tx,
    batches: &[&Batch],
    placed: &[Placed<'_>],
    kind: Transition,
) -> Result<Changed, BatchError> {
    if placed.is_empty() {
        return Ok(Changed::Count(0));
    }
    // An expiry finds the hold due, any other change finds it not yet due.
    let due = if kind == Transition::Expire {
        "<="
    } else {
        ">"
    };
    let (first, _) = placed[0];
    let one_batch = placed.iter().all(|(b, _)| *b == first);
    if one_batch && tx.backend() == Backend::Postgres {
        // One batch (one SKU, one time): its keys as a list, one probe of
        // the primary key each, and no table to build. Not on SQLite,
        // whose planner, without statistics, reads such a list by the
        // index of HELD rows by expiry (every HELD row of the SKU) where
        // the table below drives the primary key.
        let batch = batches[first];
        let text = format!(
            "UPDATE reservations SET status = '{}'
             WHERE tenant = $1 AND sku = $2 AND request_key {} AND status = 'HELD'
               AND expires_at {due} $4",
            kind.target().as_str(),
            tx.backend().in_list("$3")
        );
        let changed = sql(text)
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str())
            .bind(placed.iter().map(|(_, d)| d.0.as_str()).collect::<Vec<_>>())
            .bind(at(batch.now_ms))
            .execute(tx)
            .await
            .map_err(|e| BatchError::whole(e.into()))?;
        return Ok(Changed::Count(changed));
    }
    let table = transition_table(batches, placed);
    let text = format!(
        "UPDATE reservations AS r SET status = '{}'
         FROM {}
         WHERE {} AND r.sku = u.of_sku AND r.status = 'HELD' AND r.expires_at {due} u.at
         RETURNING tenant, request_key",
        kind.target().as_str(),
        rows_by_key(&table, tx.backend()),
        row_is_found(tx.backend())
    );
    changed_rows(sql(text).bind_table(table), tx).await
}

/// Extends the `placed` holds in one statement; the rows it changed.
async fn extend(
    tx: &mut Tx,
    batches: &[&Batch],
    placed: &[Placed<'_>],
) -> Result<Changed, BatchError> {
    if placed.is_empty() {
        return Ok(Changed::Count(0));
    }
    let until: Vec<_> = placed
        .iter()
        .map(|(_, d)| match d.2 {
            Transition::Extend { expires_at_ms } => at(expires_at_ms),
            _ => unreachable!("only extends are extended"),
        })
        .collect();
    let table = transition_table(batches, placed).column("until", until);
    let text = format!(
        "UPDATE reservations AS r SET expires_at = u.until, extended = TRUE
         FROM {}
         WHERE {} AND r.sku = u.of_sku AND r.status = 'HELD' AND NOT r.extended
           AND r.expires_at > u.at
         RETURNING tenant, request_key",
        rows_by_key(&table, tx.backend()),
        row_is_found(tx.backend())
    );
    changed_rows(sql(text).bind_table(table), tx).await
}

/// The FROM items of a statement over a round's `table` (named `u`):
/// on PostgreSQL with each row's reservation found by its primary key
/// (`f.found`), in a subquery the planner keeps apart (`OFFSET 0`).
///
/// A plain join leaves the way to the rows to the planner, which judges
/// by the table's statistics; in a sale they are minutes old while the
/// table grows by thousands of holds a second, and with them PostgreSQL
/// hashed every HELD row for each statement (25-60 ms where a key lookup
/// per row takes tens of µs; `auto_explain`, docs/performance.md). Found
/// by key, each row costs one index probe whatever the statistics say.
/// On SQLite the table's rows drive the join (they are all the planner
/// knows of `json_each`), each finding its reservation by the key.
fn rows_by_key(table: &Table, backend: Backend) -> String {
    match backend {
        Backend::Postgres => format!(
            "{} CROSS JOIN LATERAL (SELECT x.ctid AS found FROM reservations AS x
                 WHERE x.tenant = u.of_tenant AND x.request_key = u.of_key OFFSET 0) AS f",
            table.sql(backend, 1)
        ),
        Backend::Sqlite => table.sql(backend, 1),
    }
}

/// The condition that joins `r` to its row of the table ([`rows_by_key`]).
fn row_is_found(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "r.ctid = f.found",
        Backend::Sqlite => "r.tenant = u.of_tenant AND r.request_key = u.of_key",
    }
}

/// Runs `statement` and reads the rows it returned as [`Changed::Rows`].
async fn changed_rows(statement: sql::Statement<'_>, tx: &mut Tx) -> Result<Changed, BatchError> {
    let whole = |e: sql::Error| BatchError::whole(e.into());
    let rows = statement.fetch_all(tx).await.map_err(whole)?;
    rows.iter()
        .map(|row| Ok((row.try_get("tenant")?, row.try_get("request_key")?)))
        .collect::<Result<Vec<_>, sql::Error>>()
        .map(Changed::Rows)
        .map_err(whole)
}

/// Moves the units of the `placed` transitions on their batches' ledgers,
/// once every one of them changed its row (their keys are distinct, so as
/// many rows changed as were named); otherwise names the first batch with
/// a row that did not change.
fn moved(
    batches: &[&Batch],
    placed: &[Placed<'_>],
    changed: &Changed,
    applied: &mut [Applied],
) -> Result<(), BatchError> {
    let count = match changed {
        Changed::Count(count) => *count,
        Changed::Rows(rows) => rows.len() as u64,
    };
    if count != placed.len() as u64 {
        return Err(BatchError {
            batch: Some(first_unchanged(batches, placed, changed)),
            error: StoreError::Conflict(format!(
                "transition changed {count} of {} rows",
                placed.len()
            )),
        });
    }
    for &(b, decided) in placed {
        settle([decided], &mut applied[b].moves).map_err(|error| BatchError {
            batch: Some(b),
            error,
        })?;
    }
    Ok(())
}

/// The batch of the first of `placed` whose row did not change.
fn first_unchanged(batches: &[&Batch], placed: &[Placed<'_>], changed: &Changed) -> usize {
    let Changed::Rows(rows) = changed else {
        // A count is of one batch's keys.
        return placed[0].0;
    };
    let rows: HashSet<(&str, &str)> = rows.iter().map(|(t, k)| (t.as_str(), k.as_str())).collect();
    placed
        .iter()
        .find(|(b, d)| !rows.contains(&(batches[*b].tenant.as_str(), d.0.as_str())))
        .map_or(placed[0].0, |(b, _)| *b)
}

/// Moves the units of transitions the database made.
fn settle<'a>(
    settled: impl IntoIterator<Item = &'a Decided>,
    moves: &mut Moves,
) -> Result<(), StoreError> {
    for (_, qty, transition) in settled {
        transition
            .apply_to_ledger(&mut moves.0, *qty)
            .map_err(Moves::refused)?;
    }
    Ok(())
}

/// Applies stock deltas to the batch's moves and writes settings, mode and
/// pause, each required to change the SKU's row.
async fn apply_changes(tx: &mut Tx, batch: &Batch, moves: &mut Moves) -> Result<(), StoreError> {
    for change in &batch.changes {
        let set = match *change {
            StockChange::Receive(units) => {
                moves.0.receive(units);
                continue;
            }
            StockChange::Return(units) => {
                moves.0.return_units(units).map_err(Moves::refused)?;
                continue;
            }
            StockChange::Settings(_) => {
                "max_per_user = $3, hold_ttl_ms = $4, user_limit_scope = $5"
            }
            StockChange::Mode(_) => "mode = $3",
            StockChange::Pause(_) => "paused = $3",
        };
        let text = format!(
            "UPDATE sku_stock SET {set}, updated_at = {} WHERE tenant = $1 AND sku = $2",
            tx.backend().now()
        );
        let statement = sql(text)
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str());
        let statement = match *change {
            StockChange::Settings(settings) => statement
                .bind(settings.max_per_user as i32)
                .bind(settings.hold_ttl.get() as i64)
                .bind(settings.user_limit_scope.as_str()),
            StockChange::Mode(mode) => statement.bind(mode.as_str()),
            StockChange::Pause(paused) => statement.bind(paused),
            StockChange::Receive(_) | StockChange::Return(_) => statement,
        };
        super::one_sku_row(statement.execute(tx).await?)?;
    }
    Ok(())
}

/// Credits grants not seen before; the primary key of `applied_grants`
/// makes a duplicate delivery a no-op.
async fn apply_grants(
    tx: &mut Tx,
    batch: &Batch,
    moves: &mut Moves,
) -> Result<Vec<TransferId>, StoreError> {
    if batch.grants.is_empty() {
        return Ok(Vec::new());
    }
    let table = Table::new("u")
        .column(
            "id",
            batch
                .grants
                .iter()
                .map(|g| g.id.as_str())
                .collect::<Vec<_>>(),
        )
        .column(
            "units",
            batch
                .grants
                .iter()
                .map(|g| g.units as i64)
                .collect::<Vec<_>>(),
        );
    let text = format!(
        "INSERT INTO applied_grants (id, tenant, sku, units, applied_at)
         SELECT u.id, $1, $2, u.units, $5 FROM {}
         ORDER BY u.n
         ON CONFLICT (id) DO NOTHING
         RETURNING id, units",
        table.sql(tx.backend(), 3)
    );
    let rows = sql(text)
        .bind(batch.tenant.as_str())
        .bind(batch.sku.as_str())
        .bind_table(table)
        // The agent's clock, as prune's cut: the database's may differ.
        .bind(at(batch.now_ms))
        .fetch_all(tx)
        .await?;
    let mut applied = Vec::with_capacity(rows.len());
    for row in &rows {
        let units: i64 = row.try_get("units")?;
        moves
            .0
            .receive(u64::try_from(units).map_err(|_| super::rows::bad_row("units"))?);
        applied.push(super::rows::ident(row, "id")?);
    }
    Ok(applied)
}

/// Debits returns and records them in the outbox, in the same transaction.
async fn debit_returns(tx: &mut Tx, batch: &Batch, moves: &mut Moves) -> Result<(), StoreError> {
    for ret in &batch.returns {
        sql("INSERT INTO outbox_returns (id, tenant, sku, units) VALUES ($1, $2, $3, $4)")
            .bind(ret.id.as_str())
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str())
            .bind(ret.units as i64)
            .execute(tx)
            .await?;
        moves.0.return_units(ret.units).map_err(Moves::refused)?;
    }
    Ok(())
}

/// Inserts the holds of every batch in one statement ([`super::holds`]);
/// each row it inserted moves its batch's counters.
async fn insert_holds(
    tx: &mut Tx,
    batches: &[&Batch],
    applied: &mut [Applied],
) -> Result<Vec<Vec<bool>>, StoreError> {
    let columns = HoldColumns::new(batches);
    if columns.is_empty() {
        return columns.inserted(Vec::new(), |_, _| Ok(()));
    }
    let table = columns.table();
    let text = super::holds::insert_sql(&table, tx.backend(), "");
    let rows = sql(text).bind_table(table).fetch_all(tx).await?;
    let returned = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get("tenant")?,
                row.try_get("sku")?,
                row.try_get("request_key")?,
            ))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let inserted = columns.inserted(returned, |b, qty| {
        applied[b].moves.0.hold(qty.units()).map_err(Moves::refused)
    })?;
    let used: Vec<&str> = batches
        .iter()
        .zip(&inserted)
        .flat_map(|(batch, inserted)| batch.holds.iter().zip(inserted))
        .filter(|(_, &inserted)| inserted)
        .filter_map(|(hold, _)| hold.borrow.as_ref().map(TransferId::as_str))
        .collect();
    super::limits::mark_used(tx, &used).await?;
    Ok(inserted)
}

/// Moves the counters of every batch that changed any in one conditional
/// statement. The hot rows are touched last; the WHERE clause refuses a
/// move that would take `available` below zero, and the CHECK constraints
/// any that would unbalance a ledger. A batch whose row did not move is
/// named in the error, so the committer can answer it alone.
async fn move_counters(
    tx: &mut Tx,
    batches: &[&Batch],
    applied: &[Applied],
) -> Result<(), BatchError> {
    // One row of moves per SKU, in SKU order: a counter row is joined to
    // one row of moves (a group of owners' batches has one per SKU; a
    // group of carts may have many, summed here), and rows lock in one
    // order in every transaction.
    let mut by_sku: BTreeMap<(&str, &str), (usize, [i64; 5])> = BTreeMap::new();
    for b in (0..batches.len()).filter(|&b| !applied[b].moves.is_zero()) {
        let moves = &applied[b].moves;
        let deltas = [
            moves.of(|l| l.available),
            moves.of(|l| l.held),
            moves.of(|l| l.sold),
            moves.of(|l| l.received),
            moves.of(|l| l.returned),
        ];
        let key = (batches[b].tenant.as_str(), batches[b].sku.as_str());
        let (_, sum) = by_sku.entry(key).or_insert((b, [0; 5]));
        for (total, delta) in sum.iter_mut().zip(deltas) {
            *total += delta;
        }
    }
    if by_sku.is_empty() {
        return Ok(());
    }
    let moving: Vec<usize> = by_sku.values().map(|(b, _)| *b).collect();
    let column =
        |counter: usize| -> Vec<i64> { by_sku.values().map(|(_, sum)| sum[counter]).collect() };
    let tenants: Vec<&str> = by_sku.keys().map(|(tenant, _)| *tenant).collect();
    let skus: Vec<&str> = by_sku.keys().map(|(_, sku)| *sku).collect();
    let table = Table::new("d")
        .column("of_tenant", tenants.clone())
        .column("of_sku", skus.clone())
        .column("available", column(0))
        .column("held", column(1))
        .column("sold", column(2))
        .column("received", column(3))
        .column("returned", column(4));
    let text = format!(
        "UPDATE sku_stock AS s
         SET available = s.available + d.available, held = s.held + d.held,
             sold = s.sold + d.sold, received = s.received + d.received,
             returned = s.returned + d.returned, updated_at = {}
         FROM {}
         WHERE s.tenant = d.of_tenant AND s.sku = d.of_sku AND s.available + d.available >= 0
         RETURNING tenant, sku",
        tx.backend().now(),
        table.sql(tx.backend(), 1)
    );
    let rows = sql(text)
        .bind_table(table)
        .fetch_all(tx)
        .await
        .map_err(|e| {
            BatchError::whole(match e {
                sql::Error::CheckViolation(_) => {
                    StoreError::Conflict("counter update refused by a CHECK constraint".into())
                }
                other => other.into(),
            })
        })?;
    let mut moved = HashSet::with_capacity(rows.len());
    for row in &rows {
        let tenant: String = row
            .try_get("tenant")
            .map_err(|e| BatchError::whole(e.into()))?;
        let sku: String = row
            .try_get("sku")
            .map_err(|e| BatchError::whole(e.into()))?;
        moved.insert((tenant, sku));
    }
    match (0..moving.len())
        .position(|i| !moved.contains(&(tenants[i].to_owned(), skus[i].to_owned())))
    {
        None => Ok(()),
        Some(i) => Err(BatchError {
            batch: Some(moving[i]),
            error: StoreError::Conflict("not enough units available".into()),
        }),
    }
}
