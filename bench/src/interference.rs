//! Other work on the machine during a run, so a result can say whether it
//! is to be trusted.
//!
//! The benchmark shares two cores with whatever else runs (a build, another
//! test suite). A background thread samples `/proc` four times a second and
//! sums the CPU time of every process that is not part of the benchmark
//! (this process, its servers, PostgreSQL, kernel threads); a result taken
//! while others used a noticeable share of the machine is marked suspect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often `/proc` is sampled; a process that lives shorter than this
/// between samples is missed.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);
/// Share of the machine others may use before a result is called suspect.
pub const FOREIGN_SHARE_MAX: f64 = 0.05;
/// Clock ticks per second of `/proc` times (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// Process names that belong to the benchmark.
const OURS: [&str; 6] = [
    "bench",
    "bench-server",
    "region-agent",
    "coordinator",
    "postgres",
    "perf",
];

fn is_ours(comm: &str) -> bool {
    OURS.contains(&comm)
        || [
            "kworker",
            "ksoftirq",
            "rcu",
            "migration",
            "kdamond",
            "swapper",
        ]
        .iter()
        .any(|k| comm.starts_with(k))
}

/// CPU ticks of one process, from `/proc/<pid>/stat`.
fn process_ticks(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // After the name: state ppid ... utime is field 14 of the line, the 12th here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// Busy ticks of the whole machine, from `/proc/stat`.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = v.get(3)? + v.get(4)?;
    Some(v.iter().sum::<u64>() - idle)
}

fn sample(into: &mut HashMap<u32, (String, u64)>) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| process_ticks(&s))
        {
            into.insert(pid, stat);
        }
    }
}

/// CPU seconds used so far by the processes named `comm` that run now,
/// summed (a process that has exited no longer counts: take the
/// difference of two readings over a window in which they live).
pub fn cpu_seconds_of(comm: &str) -> f64 {
    let mut processes = HashMap::new();
    sample(&mut processes);
    let ticks: u64 = processes
        .values()
        .filter(|(name, _)| name == comm)
        .map(|(_, ticks)| ticks)
        .sum();
    ticks as f64 / TICKS_PER_SECOND
}

/// CPU seconds this process has used so far.
pub fn own_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| process_ticks(&stat))
        .map_or(0.0, |(_, ticks)| ticks as f64 / TICKS_PER_SECOND)
}

/// A running watcher; [`Watch::stop`] ends it and reports.
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Interference>,
}

/// What others did while the benchmark ran.
#[derive(Debug, Clone, Default)]
pub struct Interference {
    /// Wall time watched.
    pub wall: Duration,
    /// CPU seconds the whole machine was busy.
    pub busy_cpu_s: f64,
    /// CPU seconds used by processes outside the benchmark.
    pub foreign_cpu_s: f64,
    /// The largest foreign users, by name, CPU seconds.
    pub top: Vec<(String, f64)>,
}

impl Interference {
    /// Others' share of the machine's capacity while watched.
    pub fn foreign_share(&self, cores: usize) -> f64 {
        self.foreign_cpu_s / (self.wall.as_secs_f64() * cores as f64).max(1e-9)
    }

    /// One line for the report.
    pub fn summary(&self, cores: usize) -> String {
        let share = self.foreign_share(cores);
        let verdict = if share <= FOREIGN_SHARE_MAX {
            "quiet"
        } else {
            "BUSY: numbers are suspect; rerun on a quiet machine"
        };
        let top: Vec<String> = self
            .top
            .iter()
            .map(|(name, s)| format!("{name} {s:.1} s"))
            .collect();
        format!(
            "Other processes used {:.1} CPU-seconds ({:.1}% of the machine) during the run: {verdict}{}{}.",
            self.foreign_cpu_s,
            100.0 * share,
            if top.is_empty() { "" } else { "; " },
            top.join(", ")
        )
    }
}

impl Watch {
    /// Starts watching.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let busy_before = machine_busy_ticks().unwrap_or(0);
            let mut first = HashMap::new();
            sample(&mut first);
            let mut last = first.clone();
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(SAMPLE_INTERVAL);
                sample(&mut last);
            }
            let busy_after = machine_busy_ticks().unwrap_or(busy_before);
            let mut foreign: HashMap<String, u64> = HashMap::new();
            for (pid, (comm, ticks)) in &last {
                let before = first.get(pid).map_or(0, |(_, t)| *t);
                let used = ticks.saturating_sub(before);
                if used > 0 && !is_ours(comm) {
                    *foreign.entry(comm.clone()).or_default() += used;
                }
            }
            let foreign_ticks: u64 = foreign.values().sum();
            let mut top: Vec<(String, f64)> = foreign
                .into_iter()
                .map(|(name, t)| (name, t as f64 / TICKS_PER_SECOND))
                .filter(|(_, s)| *s >= 0.1)
                .collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top.truncate(5);
            Interference {
                wall: started.elapsed(),
                busy_cpu_s: busy_after.saturating_sub(busy_before) as f64 / TICKS_PER_SECOND,
                foreign_cpu_s: foreign_ticks as f64 / TICKS_PER_SECOND,
                top,
            }
        });
        Self { stop, thread }
    }

    /// Stops watching and reports.
    pub fn stop(self) -> Interference {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the name and CPU ticks are read even when the name has spaces
    /// and parentheses.
    #[test]
    fn parses_proc_stat_lines() {
        let line = "42 (tokio rt (x)) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0 10 0 0";
        assert_eq!(process_ticks(line), Some(("tokio rt (x)".into(), 12)));
        assert!(is_ours("postgres"));
        assert!(!is_ours("rustc"));
    }
}
