//! The swarm: random configurations, safety with faults, then liveness.

use simulations::swarm::run_swarm;

/// Seeds the CI swarm runs. Each seed is a small random world, so a few
/// hundred fit well within a minute even in a debug build.
const SEEDS: u64 = 500;

/// Goal: a few hundred random configurations (regions, demand, latencies,
/// message loss, duplication, reordering, partitions, coordinator outages,
/// agent crashes, every policy with random settings, some under a global
/// per-user limit) keep every safety property after every event, and
/// converge once the faults stop.
#[test]
fn swarm_of_random_worlds_is_safe_and_live() {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let summary = run_swarm(1, SEEDS, threads, None);
    for f in &summary.failures {
        eprintln!(
            "{f}\n  reproduce: simulate swarm --seeds 1 --first-seed {}",
            f.seed
        );
    }
    assert!(
        summary.failures.is_empty(),
        "{} seeds failed",
        summary.failures.len()
    );
    assert_eq!(summary.passed, SEEDS);
}
