//! Fidelity: one recorded stream of inputs (buyers' commands, clock moves,
//! the coordinator's take answers and directives) drives two copies of the
//! SKU owner, one over the agent's PostgreSQL store and one over the
//! simulator's database, and every decision, every database verdict and
//! every answer must be the same. The owner is one piece of code
//! (`escrow_core::owner`); this shows the two databases its drivers give it
//! judge alike, so what the simulator predicts is what the agent does.
//! PostgreSQL only: the other side is the simulator's in-memory database.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::collections::BTreeMap;

use common::{assert_balanced, stored, TestDb};
use escrow_core::batch::BatchOutcome;
use escrow_core::owner::{Action, Command, Io, OwnerConfig, ReserveRequest, SkuOwner, Ticket};
use escrow_core::protocol::{SkuDirective, TakeRequest, TakeResponse, TransferMsg};
use escrow_core::{
    Book, Deadline, Mode, Qty, RegionName, RequestKey, Reservation, Sku, SkuSettings, Tenant,
    TransferId, UserId,
};
use region_agent::store::postgres::PgStore;
use region_agent::store::{Epoch, Store};
use simulations::database::Database;
use sqlx::PgPool;
use test_support::draw::Draw;

const T0_MS: u64 = 1_700_000_000_000;

/// The coordinator, scripted the same for both owners: a pool that grants
/// what it has and says sold_out_everywhere only when nothing is left anywhere.
struct Pool {
    units: u64,
    in_transit: BTreeMap<TransferId, u64>,
}

impl Pool {
    fn take(&mut self, req: &TakeRequest) -> TakeResponse {
        let granted = req.units.min(self.units);
        self.units -= granted;
        let grant = (granted > 0).then(|| TransferMsg {
            id: req.id.clone(),
            tenant: req.tenant.clone(),
            sku: req.sku.clone(),
            units: granted,
        });
        if let Some(g) = &grant {
            self.in_transit.insert(g.id.clone(), g.units);
        }
        TakeResponse {
            grant,
            sold_out_everywhere: granted < req.units
                && self.units == 0
                && self.in_transit.is_empty(),
            paused: false,
        }
    }
}

fn sorted(mut rows: Vec<Reservation>) -> Vec<Reservation> {
    rows.sort_by(|a, b| a.request_key.cmp(&b.request_key));
    rows
}

fn normal(mut o: BatchOutcome) -> BatchOutcome {
    o.applied_grants.sort();
    o
}

/// Both owners and their databases, moved step by step in lockstep.
struct Pair {
    store: PgStore,
    epoch: Epoch,
    tenant: Tenant,
    db: Database,
    agent: SkuOwner,
    sim: SkuOwner,
    pool: Pool,
    decisions: u64,
}

impl Pair {
    /// Carries out both owners' I/O, asserting each request is the same.
    async fn drive(&mut self) {
        loop {
            let io = self.agent.poll_io();
            assert_eq!(io, self.sim.poll_io(), "the same decision on both sides");
            let Some(io) = io else {
                break;
            };
            self.decisions += 1;
            match io {
                Io::Read(keys) => {
                    let from_pg =
                        sorted(self.store.reservations(&self.tenant, &keys).await.unwrap());
                    let from_sim = sorted(self.db.read(&keys));
                    assert_eq!(from_pg, from_sim, "the same rows");
                    self.agent.handle_read(Some(from_pg));
                    self.sim.handle_read(Some(from_sim));
                }
                Io::Take(req) => {
                    let answer = self.pool.take(&req);
                    self.agent.handle_take_answer(Some(answer.clone()));
                    self.sim.handle_take_answer(Some(answer));
                }
                Io::Commit(batch) => {
                    let from_pg = normal(self.store.commit(self.epoch, &batch).await.unwrap());
                    let from_sim = normal(self.db.commit(&batch));
                    assert_eq!(from_pg, from_sim, "the same verdict on {batch:?}");
                    for id in &from_pg.applied_grants {
                        self.pool.in_transit.remove(id);
                    }
                    for r in &batch.returns {
                        self.pool.units += r.units;
                    }
                    self.agent.handle_commit_result(batch.clone(), Ok(from_pg));
                    self.sim.handle_commit_result(batch, Ok(from_sim));
                }
                Io::Reload => panic!("no commit fails in this stream"),
            }
        }
        let answers = |o: &mut SkuOwner| std::iter::from_fn(|| o.poll_reply()).collect::<Vec<_>>();
        assert_eq!(
            answers(&mut self.agent),
            answers(&mut self.sim),
            "the same answers"
        );
        assert_eq!(self.agent.ledger(), self.sim.ledger());
        assert_eq!(self.agent.ledger(), self.db.book.ledger);
    }
}

test_support::postgres_only!(
    migrator: region_agent::store::postgres::MIGRATOR;
    one_stream_gives_the_same_decisions_over_both_databases,
);

/// Goal: 400 steps of a recorded stream (reserves, confirms, releases,
/// extends, clock moves past expiries, takes, recalls and grants) give the
/// same decisions, database verdicts and answers over PostgreSQL as over
/// the simulator's database, and both databases end with the same rows.
async fn one_stream_gives_the_same_decisions_over_both_databases(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let epoch = store
        .take_lease(&RegionName::parse("eu").unwrap())
        .await
        .unwrap();
    let tenant = Tenant::parse("acme").unwrap();
    let sku = Sku::parse("tee").unwrap();
    let settings = SkuSettings::parse(Some(2), Some(5_000)).unwrap();
    assert!(store
        .create_sku(epoch, &tenant, &sku, settings, 5)
        .await
        .unwrap());
    let loaded = store.load_sku(&tenant, &sku).await.unwrap().unwrap();
    let mut book = Book::new(sku.clone(), settings);
    book.ledger.receive(5);
    let db = Database::new(tenant.clone(), book, Mode::Escrow);
    assert_eq!(db.record(), loaded, "both databases start alike");
    let cfg = OwnerConfig {
        max_in_flight: 8,
        parked_max: 64,
        coordinated: true,
        transfer_id_prefix: "fidelity".into(),
    };
    let mut pair = Pair {
        agent: SkuOwner::new(cfg.clone(), loaded, T0_MS),
        sim: SkuOwner::new(cfg, db.record(), T0_MS),
        store,
        epoch,
        tenant: tenant.clone(),
        db,
        pool: Pool {
            units: 12,
            in_transit: BTreeMap::new(),
        },
        decisions: 0,
    };

    let mut stream = Draw::new(0x9E37_79B9_7F4A_7C15);
    let mut now = T0_MS;
    let mut queued = Vec::new();
    let mut recalled = 0;
    for ticket in 1..=400 as Ticket {
        let key = RequestKey::parse(&format!("k{}", stream.below(40))).unwrap();
        let deadline = Deadline::after(now, 10_000);
        match stream.below(12) {
            0..=3 => queued.push(Command::Reserve {
                ticket,
                request: ReserveRequest {
                    borrow: None,
                    request_key: key,
                    user_id: UserId::parse(&format!("u{}", stream.below(16))).unwrap(),
                    qty: Qty::parse(1 + stream.below(2) as i64, 2).unwrap(),
                    ttl: None,
                },
                deadline,
                known: false,
            }),
            4 => queued.push(Command::Act {
                ticket,
                key,
                action: Action::Confirm,
                deadline,
            }),
            5 => queued.push(Command::Act {
                ticket,
                key,
                action: Action::Release,
                deadline,
            }),
            6 => queued.push(Command::Act {
                ticket,
                key,
                action: Action::Extend(None),
                deadline,
            }),
            7 | 8 => {
                let room = pair.agent.batch_room().min(queued.len());
                let batch: Vec<Command> = queued.drain(..room).collect();
                pair.agent.handle_commands(now, batch.clone());
                pair.sim.handle_commands(now, batch);
                pair.drive().await;
            }
            9 | 10 => {
                now += stream.below(2_500);
                pair.agent.handle_timeout(now);
                pair.sim.handle_timeout(now);
                pair.drive().await;
            }
            _ => {
                recalled += stream.below(2);
                let directive = SkuDirective {
                    user_limit_scope: Default::default(),
                    limit_regions: Vec::new(),
                    tenant: Tenant::parse("acme").unwrap(),
                    sku: Sku::parse("tee").unwrap(),
                    mode: Mode::Escrow,
                    paused: false,
                    max_per_user: 2,
                    hold_ttl_ms: 5_000,
                    return_until: recalled,
                    sold_out_everywhere: false,
                };
                let grants: Vec<TransferMsg> = pair
                    .pool
                    .in_transit
                    .iter()
                    .map(|(id, units)| TransferMsg {
                        id: id.clone(),
                        tenant: Tenant::parse("acme").unwrap(),
                        sku: Sku::parse("tee").unwrap(),
                        units: *units,
                    })
                    .collect();
                pair.agent.handle_directive(&directive, grants.clone());
                pair.sim.handle_directive(&directive, grants);
            }
        }
    }
    pair.agent.handle_commands(now, queued.clone());
    pair.sim.handle_commands(now, queued);
    pair.drive().await;
    pair.agent.handle_close();
    pair.sim.handle_close();
    pair.drive().await;

    let keys: Vec<RequestKey> = (0..40)
        .map(|k| RequestKey::parse(&format!("k{k}")).unwrap())
        .collect();
    let rows = sorted(pair.store.reservations(&tenant, &keys).await.unwrap());
    assert_eq!(
        rows,
        sorted(pair.db.read(&keys)),
        "both databases end with the same rows"
    );
    assert!(
        rows.len() > 10 && pair.decisions > 100,
        "the stream exercised the owner: {} rows, {} decisions",
        rows.len(),
        pair.decisions
    );
    assert_balanced(&stored(&TestDb::postgres(pool.clone()), "tee").await);
    println!(
        "fidelity: {} decisions, {} reservations, ledger {:?}",
        pair.decisions,
        rows.len(),
        pair.db.book.ledger
    );
}
