//! Swarm testing: a random configuration per seed, a safety phase with
//! faults, then a liveness phase without them.
//!
//! Each seed draws its own scenario (regions, stock, demand, latencies,
//! buyer behaviour, message faults, partitions, outages, crashes, timings)
//! and its own policy and policy settings, and some a global per-user
//! limit (buyers borrowing their place from their home region, some users
//! coming back in other regions) and some a shop of several SKUs with
//! buyers checking out carts of them, so many seeds explore far more of the
//! space than hand-written scenarios. During the safety phase the
//! world checks every safety property after every event. Then every fault
//! ends and the liveness phase runs until everything converges: every
//! buyer done, every hold resolved, no transfer unacknowledged, every
//! report current, every borrowed place settled, leases equal to quotas,
//! audit drift 0. A seed that does
//! not converge in time fails too, and so does one that told a buyer
//! SOLD_OUT while its units were free before any hold had ended
//! ([`World::unfounded_sold_outs`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use escrow_core::UserLimitScope;
use indicatif::ProgressBar;

use crate::policies::POLICY_NAMES;
use crate::rng::{streams, Rng};
use crate::run::panic_message;
use crate::scenario::*;
use crate::shop::Shop;
use crate::world::World;

/// Extra simulated time after demand ends during which faults may still act.
const SAFETY_TAIL_S: f64 = 10.0;
/// Time allowed for convergence beyond the longest hold.
const LIVENESS_BUDGET_S: f64 = 120.0;

/// One seed's configuration.
#[derive(Debug, Clone)]
pub struct SwarmCase {
    /// The seed.
    pub seed: u64,
    /// The drawn scenario.
    pub scenario: Scenario,
    /// The drawn policy.
    pub policy: &'static str,
}

/// A seed that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwarmFailure {
    /// The seed; `simulate swarm --seeds 1 --first-seed SEED` reproduces it.
    pub seed: u64,
    /// The policy it ran.
    pub policy: String,
    /// `safety` or `liveness`.
    pub phase: &'static str,
    /// What went wrong.
    pub what: String,
}

impl std::fmt::Display for SwarmFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} ({}): {} failed: {}",
            self.seed, self.policy, self.phase, self.what
        )
    }
}

/// What a passing seed did, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwarmPass {
    /// Events simulated.
    pub events: u64,
    /// Units sold.
    pub sold: u64,
}

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.below(items.len() as u64) as usize]
}

/// Draws the configuration of `seed`.
pub fn case(seed: u64) -> SwarmCase {
    let mut g = Rng::stream(seed, streams::SWARM, 0);
    let n_regions = g.range(1, 5) as usize;
    let regions: Vec<RegionConfig> = (0..n_regions)
        .map(|i| RegionConfig {
            name: format!("r{i}"),
            weight: if g.chance(0.1) {
                0
            } else {
                g.range(1, 4) as u32
            },
            demand: g.range_f64(0.05, 1.0),
            rtt_ms: pick(&mut g, &[1.0, 20.0, 80.0, 150.0, 250.0]) * g.range_f64(0.5, 1.0),
            jitter_ms: g.range_f64(0.0, 30.0),
        })
        .collect();
    let mut regions = regions;
    if regions.iter().all(|r| r.weight == 0) {
        regions[0].weight = 1;
    }
    let rtt_max = regions
        .iter()
        .map(|r| r.rtt_ms + r.jitter_ms * 2.0)
        .fold(0.0, f64::max);
    let total = g.range(1, 300);
    let max_per_user = if g.chance(0.3) {
        g.range(2, 3) as u32
    } else {
        1
    };
    let hold_ttl_ms = g.range(1_000, 8_000);
    let duration_s = g.range_f64(0.5, 12.0);
    let buyers = ((total as f64 * g.range_f64(0.5, 4.0)) as u64).clamp(1, 1_500);
    let bots = if g.chance(0.3) {
        let start_s = g.range_f64(0.0, duration_s * 0.8);
        vec![BotBurst {
            region: format!("r{}", g.below(n_regions as u64)),
            start_s,
            duration_s: g.range_f64(0.05, duration_s - start_s),
            bots: g.range(1, 150),
            retry_ms: g.range(20, 500),
            retries: g.range(0, 8) as u32,
        }]
    } else {
        Vec::new()
    };
    let abandon = g.range_f64(0.0, 0.5);
    let sync_interval_ms = g.range(20, 500);
    let faulty = g.chance(0.8);
    let network = NetworkConfig {
        loss: if faulty { g.range_f64(0.0, 0.3) } else { 0.0 },
        duplicate: if faulty { g.range_f64(0.0, 0.3) } else { 0.0 },
        reorder: if faulty { g.range_f64(0.0, 0.5) } else { 0.0 },
        reorder_ms: g.range_f64(0.0, 300.0),
    };
    let kinds = [
        FaultKind::Partition,
        FaultKind::CoordinatorDown,
        FaultKind::CoordinatorFrozen,
        FaultKind::AgentCrash,
    ];
    let faults = (0..g.range(0, 4))
        .map(|_| {
            let kind = pick(&mut g, &kinds);
            let by_sold = g.chance(0.4);
            FaultConfig {
                kind,
                region: Some(format!("r{}", g.below(n_regions as u64))),
                start_s: (!by_sold).then(|| g.range_f64(0.0, duration_s)),
                start_sold: by_sold.then(|| g.range_f64(0.0, 1.0)),
                end_sold: g.chance(0.3).then(|| g.range_f64(0.0, 1.0)),
                duration_s: g.range_f64(0.05, 8.0),
            }
        })
        .collect();
    let low_water_s = g.range_f64(0.0, 3.0);
    let refill = RefillConfig {
        reserve_fraction: g.range_f64(0.0, 1.0),
        low_water_s,
        // escrow-core's refill underflows when the target is below low water.
        refill_s: low_water_s + g.range_f64(0.0, 4.0),
        min_units: g.range(0, 5),
    };
    let policies = PolicySettings {
        refill,
        proportional: ProportionalSettings {
            reserve_fraction: g.range_f64(0.0, 1.0),
            recall_min_units: g.range(0, 10),
        },
        tail_merge: TailMergeConfig {
            refill,
            merge_units: g.range(0, 50),
            merge_fraction: g.range_f64(0.0, 0.3),
            merge_horizon_ms: g.range(0, 2_000),
            merge_round_trips: g.range(0, 10),
            // The distance settings keep their defaults, so each seed draws
            // the configuration it drew before they existed.
            ..TailMergeConfig::default()
        },
    };
    let policy = pick(&mut g, &POLICY_NAMES);
    let mut scenario = Scenario {
        name: format!("swarm-{seed}"),
        description: String::new(),
        seed,
        sku: SkuConfig {
            total,
            max_per_user,
            hold_ttl_ms,
            user_limit_scope: UserLimitScope::Region,
        },
        regions,
        demand: DemandConfig {
            buyers,
            duration_s,
            ramp_s: g.range_f64(0.0, duration_s / 3.0),
            decay_s: g.range_f64(0.2, 10.0),
            base_share: g.range_f64(0.0, 1.0),
            multi_unit_share: g.range_f64(0.0, 0.5),
            bots,
        },
        buyers: BuyerConfig {
            abandon,
            release: g.range_f64(0.0, 0.2),
            extend: g.range_f64(0.0, 0.5),
            confirm_delay_ms: {
                let hi = g.range(100, hold_ttl_ms * 13 / 10);
                [g.range(0, hi), hi]
            },
            retry_after_ms: g.range(50, 2_000),
            retries: g.range(0, 5) as u32,
            ..BuyerConfig::default()
        },
        carts: None,
        agent: AgentConfig {
            sync_interval_ms,
            client_timeout_ms: (rtt_max as u64) * 2 + g.range(50, 2_000),
            commit_us: g.range(100, 5_000),
            commit_row_us: g.range(0, 200),
            gate_us: g.range(10, 100),
            one_machine: g.chance(0.5),
            max_in_flight: g.range(1, 64) as usize,
            max_waiting: g.range(1, 300) as usize,
            wait_timeout_ms: g.range(20, 2_000),
        },
        coordinator: CoordinatorConfig {
            service_us: g.range(10, 1_000),
        },
        network,
        faults,
        policies,
        run: RunConfig {
            warmup_ms: g.range(0, 2_000),
            settle_ms: 0,
            max_s: 0.0,
        },
    };
    // Drawn last, so each seed draws the configuration it drew before the
    // global limit existed, with the limit on top.
    if g.chance(0.3) {
        scenario.sku.user_limit_scope = UserLimitScope::Global;
        if g.chance(0.5) {
            scenario.buyers.users_max = (buyers / 2).max(1);
        }
    }
    // Drawn after the limit, so each seed draws what it drew before carts
    // existed; carts come with the per-region limit only.
    if scenario.sku.user_limit_scope == UserLimitScope::Region && g.chance(0.25) {
        let skus = g.range(2, 5) as u32;
        let least = g.range(1, u64::from(skus)) as u32;
        scenario.carts = Some(CartConfig {
            skus,
            share: g.range_f64(0.05, 0.6),
            items: [least, g.range(u64::from(least), u64::from(skus)) as u32],
        });
    }
    SwarmCase {
        seed,
        scenario,
        policy,
    }
}

/// Runs one seed: safety phase, then liveness phase.
pub fn check_seed(seed: u64) -> Result<SwarmPass, SwarmFailure> {
    let c = case(seed);
    let fail = |phase: &'static str, what: String| SwarmFailure {
        seed,
        policy: c.policy.to_owned(),
        phase,
        what,
    };
    if let Err(e) = c.scenario.validate() {
        return Err(fail("setup", e.to_string()));
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<SwarmPass, SwarmFailure> {
        let s = &c.scenario;
        if s.carts.is_some() {
            return check_shop(s, c.policy, seed).map_err(|(phase, what)| fail(phase, what));
        }
        let mut w = World::new(s, c.policy, seed).map_err(|e| fail("setup", e))?;
        w.run_until(|_| false, safety_end_us(s, w.sale_start_us()), None)
            .map_err(|v| fail("safety", v.to_string()))?;
        w.heal();
        let budget_s = liveness_budget_s(s);
        let deadline = w.now_us() + (budget_s * 1e6) as u64;
        let converged = w
            .run_until(World::converged, deadline, None)
            .map_err(|v| fail("liveness", v.to_string()))?;
        if !converged {
            let c = w.census();
            return Err(fail(
                "liveness",
                format!(
                    "no convergence within {budget_s:.0} s after faults stopped: quiet {}, census {c:?}, drift {}",
                    w.quiet(),
                    w.coordinator.drift()
                ),
            ));
        }
        w.check_books()
            .map_err(|v| fail("liveness", v.to_string()))?;
        if w.unfounded_sold_outs() > 0 {
            return Err(fail(
                "safety",
                format!(
                    "{} SOLD_OUT answers while the buyer's units were free and no hold had ended",
                    w.unfounded_sold_outs()
                ),
            ));
        }
        let census = w.census();
        let metrics = w.finish(0);
        Ok(SwarmPass {
            events: metrics.events,
            sold: census.sold,
        })
    }));
    match outcome {
        Ok(r) => r,
        Err(payload) => Err(fail(
            "safety",
            format!("panicked: {}", panic_message(payload.as_ref())),
        )),
    }
}

/// When the safety phase ends: demand over, plus faults' extra time.
fn safety_end_us(s: &Scenario, sale_start_us: u64) -> u64 {
    sale_start_us + ((s.demand.duration_s + SAFETY_TAIL_S) * 1e6) as u64
}

/// How long the liveness phase may take to converge, s.
fn liveness_budget_s(s: &Scenario) -> f64 {
    LIVENESS_BUDGET_S
        + 3.0 * s.sku.hold_ttl_ms as f64 / 1_000.0
        + s.buyers.confirm_delay_ms[1] as f64 / 1_000.0
}

/// One seed whose scenario has carts: the same two phases over its shop.
fn check_shop(s: &Scenario, policy: &str, seed: u64) -> Result<SwarmPass, (&'static str, String)> {
    let mut shop = Shop::new(s, policy, seed).map_err(|e| ("setup", e))?;
    let safety_end = safety_end_us(s, shop.sale_start_us());
    shop.run_until(|_| false, safety_end, None)
        .map_err(|v| ("safety", v.to_string()))?;
    shop.heal();
    let budget_s = liveness_budget_s(s);
    let deadline = shop.now_us() + (budget_s * 1e6) as u64;
    let converged = shop
        .run_until(Shop::converged, deadline, None)
        .map_err(|v| ("liveness", v.to_string()))?;
    if !converged {
        return Err((
            "liveness",
            format!(
                "no convergence of the shop within {budget_s:.0} s after faults stopped: quiet {}",
                shop.quiet()
            ),
        ));
    }
    shop.check_books()
        .map_err(|v| ("liveness", v.to_string()))?;
    let sold = shop.units_taken();
    let metrics = shop.finish(0);
    Ok(SwarmPass {
        events: metrics.events,
        sold,
    })
}

/// Result of a swarm.
#[derive(Debug, Clone, Default)]
pub struct SwarmSummary {
    /// Seeds that passed.
    pub passed: u64,
    /// Seeds that failed, by seed.
    pub failures: Vec<SwarmFailure>,
    /// Events simulated over all passing seeds.
    pub events: u64,
}

/// Runs `count` seeds from `first_seed` on up to `threads` threads.
pub fn run_swarm(
    first_seed: u64,
    count: u64,
    threads: usize,
    progress: Option<&ProgressBar>,
) -> SwarmSummary {
    let next = AtomicU64::new(0);
    let summary = Mutex::new(SwarmSummary::default());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let result = check_seed(first_seed + i);
                let mut s = summary
                    .lock()
                    .expect("no worker panics while holding the lock");
                match result {
                    Ok(p) => {
                        s.passed += 1;
                        s.events += p.events;
                    }
                    Err(f) => s.failures.push(f),
                }
                drop(s);
                if let Some(bar) = progress {
                    bar.inc(1);
                }
            });
        }
    });
    let mut s = summary.into_inner().expect("workers are done");
    s.failures.sort_by_key(|f| f.seed);
    s
}
