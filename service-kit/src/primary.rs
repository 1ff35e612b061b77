//! Following a PostgreSQL primary across hosts.
//!
//! A region whose database has a synchronous standby is given libpq's
//! multi-host URL, the form every PostgreSQL HA guide hands its clients:
//! `postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write`.
//! sqlx reads one host only, so this module splits the URL into one
//! connection per host, finds the host that is the primary now (the first
//! in the order given that is out of recovery and whose sessions are not
//! read-only, as libpq's `read-write` checks), points the pool at it,
//! refuses any connection that lands on a standby, and keeps checking: when the primary is gone or demoted, the
//! pool's new connections go to whichever host was promoted.
//!
//! Both services only write, so `target_session_attrs` may be left out,
//! `any`, `read-write` or `primary` (each meaning "the primary" here);
//! `read-only`, `standby` and `prefer-standby` are refused.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, Connection, PgConnection};

/// How often the pool's host is checked for still being the primary.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

/// Longest one host is given to answer whether it is the primary (and a
/// pooled connection to answer a ping): a database in the service's own
/// region answers in milliseconds, so a second means it is gone or frozen.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest a call waits for a connection from a pool that follows a
/// primary: a connect to a frozen host hangs until this bound, and while
/// no primary exists every call fails after it (PAUSED) instead of after
/// the single-host pool's [`crate::db::POSTGRES_ACQUIRE_TIMEOUT`]. Room
/// for one [`PROBE_TIMEOUT`] and a connect, and under the coordinator's
/// 1.8 s request bound, so a call that finds no primary is answered for
/// what it is (503 `UNAVAILABLE`), not as overloaded.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_millis(1_500);

/// The hosts of a PostgreSQL URL, each with the URL's user, database and
/// parameters, in the order the URL gives them.
#[derive(Debug, Clone)]
pub struct Hosts {
    names: Vec<String>,
    options: Vec<PgConnectOptions>,
}

impl Hosts {
    /// Splits `url` into its hosts; an error says what is wrong with it.
    pub fn parse(url: &str) -> Result<Self, String> {
        let urls = split_hosts(url)?;
        let options = urls
            .iter()
            .map(|single| PgConnectOptions::from_str(single).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let names = options
            .iter()
            .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
            .collect();
        Ok(Self { names, options })
    }

    /// How many hosts the URL names.
    pub fn len(&self) -> usize {
        self.options.len()
    }

    /// Whether the URL names no host (never true of a parsed URL).
    pub fn is_empty(&self) -> bool {
        self.options.is_empty()
    }

    /// `host:port` of host `index`.
    pub fn name(&self, index: usize) -> &str {
        &self.names[index]
    }

    /// The connection options of host `index`.
    pub fn options(&self, index: usize) -> &PgConnectOptions {
        &self.options[index]
    }

    /// Applies `change` to every host's options.
    pub fn map_options(self, change: impl Fn(PgConnectOptions) -> PgConnectOptions) -> Self {
        Self {
            names: self.names,
            options: self.options.into_iter().map(change).collect(),
        }
    }

    /// The first host, in the URL's order, that is a primary now. Every
    /// host is asked at once, so a frozen one costs [`PROBE_TIMEOUT`] once,
    /// not once per host after it.
    pub async fn find_primary(&self) -> Option<usize> {
        self.find_primary_among(|_| true).await
    }

    /// [`Self::find_primary`] among the hosts `asked` accepts (by index).
    pub async fn find_primary_among(&self, asked: impl Fn(usize) -> bool) -> Option<usize> {
        let mut probes = tokio::task::JoinSet::new();
        for (index, options) in self.options.iter().enumerate() {
            if !asked(index) {
                continue;
            }
            let options = options.clone();
            probes.spawn(async move { (index, probe(&options).await) });
        }
        let mut primaries = Vec::new();
        while let Some(probed) = probes.join_next().await {
            if let Ok((index, Some(false))) = probed {
                primaries.push(index);
            }
        }
        primaries.into_iter().min()
    }
}

/// When the pool last moved to another host: connections made before then
/// lead to the old one, and are dropped rather than tried; and a wait for
/// the next move, for calls in flight on the old host.
#[derive(Debug, Default)]
pub struct LastMove {
    at: std::sync::Mutex<Option<std::time::Instant>>,
    next: tokio::sync::Notify,
}

impl LastMove {
    /// Records that the pool moved now, waking every [`Self::next_move`].
    pub fn moved(&self) {
        if let Ok(mut at) = self.at.lock() {
            *at = Some(std::time::Instant::now());
        }
        self.next.notify_waiters();
    }

    /// Whether a connection `age` old was made before the last move.
    pub fn predates(&self, age: Duration) -> bool {
        self.at
            .lock()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| age > at.elapsed())
    }

    /// Waits until the pool next moves to another host.
    pub async fn next_move(&self) {
        self.next.notified().await;
    }
}

/// Whether the server `options` names refuses writes
/// ([`refuses_writes`]); `None` when it cannot be asked within
/// [`PROBE_TIMEOUT`].
async fn probe(options: &PgConnectOptions) -> Option<bool> {
    let asked = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut conn = options.connect().await?;
        let refuses = refuses_writes(&mut conn).await;
        let _ = conn.close().await;
        refuses
    })
    .await;
    asked.ok()?.ok()
}

/// Whether the server `conn` is connected to refuses writes: a standby,
/// or a primary whose sessions are read-only (a standby being promoted by
/// pg_auto_failover is out of recovery a moment before it takes writes).
/// libpq's `target_session_attrs=read-write` asks the same.
pub async fn refuses_writes(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool",
    )
    .fetch_one(conn)
    .await
}

/// Keeps `pool` on the primary among `hosts` (it starts on host
/// `current`) until the pool is closed: every [`FOLLOW_INTERVAL`], a
/// connection of its own asks the pool's host whether it is still the
/// primary (not a pool connection: the pool's connect retries a dead host
/// until its acquire timeout); when it cannot or is not, the hosts are
/// probed and the pool's new connections go to the primary found (those
/// made before, recorded in `last_move`, are dropped when next taken).
pub async fn follow(pool: PgPool, hosts: Hosts, mut current: usize, last_move: Arc<LastMove>) {
    while !pool.is_closed() {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        if probe(hosts.options(current)).await == Some(false) {
            continue;
        }
        // The other hosts first: waiting again on a host that just failed
        // to answer (a frozen one) would delay the move by its timeout.
        let found = match hosts.find_primary_among(|i| i != current).await {
            Some(other) => Some(other),
            None => hosts.find_primary().await,
        };
        let Some(found) = found else {
            tracing::warn!(was = hosts.name(current), "no host is a primary now");
            continue;
        };
        if found != current {
            tracing::warn!(
                was = hosts.name(current),
                now = hosts.name(found),
                "the database's primary moved; following it"
            );
            pool.set_connect_options(hosts.options(found).clone());
            last_move.moved();
            current = found;
        }
    }
}

/// One single-host URL per host of `url`
/// (`postgres://[userinfo@]h1[:p1],h2[:p2]/db?params`), without the
/// `target_session_attrs` parameter, refused where it asks for a standby.
pub fn split_hosts(url: &str) -> Result<Vec<String>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("a PostgreSQL URL starts with postgres://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => check_session_attrs(value)?,
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err("the URL names an empty host".into());
    }
    Ok(hosts
        .into_iter()
        .map(|host| format!("{scheme}://{userinfo}{host}{path}{query}"))
        .collect())
}

/// Refuses a `target_session_attrs` that would let a connection land on a
/// standby: the services write.
fn check_session_attrs(value: &str) -> Result<(), String> {
    match value {
        "any" | "read-write" | "primary" => Ok(()),
        "read-only" | "standby" | "prefer-standby" => Err(format!(
            "target_session_attrs={value}: the services write, so they need the primary \
             (use target_session_attrs=read-write)"
        )),
        other => Err(format!("target_session_attrs={other} is not a libpq value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: each host of a multi-host URL becomes a URL of its own with
    /// the same user, database and other parameters.
    #[test]
    fn a_multi_host_url_splits_into_one_url_per_host() {
        let urls = split_hosts(
            "postgres://u:p@10.0.0.1:5432,10.0.0.2:5433/db?target_session_attrs=read-write&sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            urls,
            [
                "postgres://u:p@10.0.0.1:5432/db?sslmode=disable",
                "postgres://u:p@10.0.0.2:5433/db?sslmode=disable",
            ]
        );
        let hosts = Hosts::parse("postgresql://h1,h2:6000/db").unwrap();
        assert_eq!(
            (hosts.len(), hosts.name(0), hosts.name(1)),
            (2, "h1:5432", "h2:6000")
        );
    }

    /// Goal: a single-host URL passes through unchanged but for the
    /// parameter sqlx does not know.
    #[test]
    fn a_single_host_url_is_kept() {
        assert_eq!(
            split_hosts("postgres://postgres@127.0.0.1:5432/postgres").unwrap(),
            ["postgres://postgres@127.0.0.1:5432/postgres"]
        );
        assert_eq!(
            split_hosts("postgres://h/db?target_session_attrs=primary").unwrap(),
            ["postgres://h/db"]
        );
    }

    /// Goal: a URL that asks for a standby is refused with the reason, and
    /// so is a malformed one.
    #[test]
    fn asking_for_a_standby_is_refused() {
        for value in ["read-only", "standby", "prefer-standby"] {
            let error = split_hosts(&format!("postgres://a,b/db?target_session_attrs={value}"))
                .unwrap_err();
            assert!(error.contains("need the primary"), "{error}");
        }
        assert!(split_hosts("postgres://a,b/db?target_session_attrs=bogus").is_err());
        assert!(split_hosts("postgres://a,,b/db").is_err());
        assert!(split_hosts("127.0.0.1:5432").is_err());
    }
}
